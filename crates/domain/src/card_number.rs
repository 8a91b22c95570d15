//! Finding primary account numbers (card numbers) in text a client sends, so that none is ever
//! stored: the service takes card tokens, and a number in a token or a description would sit in
//! the idempotency record, the replay cache and the logs for the whole retention.

/// The fewest and most digits a card number has (ISO/IEC 7812).
const PAN_DIGITS: std::ops::RangeInclusive<usize> = 13..=19;
/// How many digits a group of a card number printed in groups has.
const PRINTED_GROUP: std::ops::RangeInclusive<usize> = 2..=6;
/// How many spaces and dashes may stand between two groups of one number (`4111 - 1111`).
const MAX_SEPARATORS: std::ops::RangeInclusive<usize> = 1..=3;

/// Whether `text` holds something that reads as a card number: 13 to 19 digits that pass the
/// Luhn check, written together or in groups split by up to three spaces or dashes
/// (`4111 1111 1111 1111`, `4111-1111-1111-1111`, `4111 - 1111 ...`).
///
/// A run of digit groups is judged by every span of whole groups in it that could be a printed
/// card number, so a number followed by its security code (`4111 1111 1111 1111 123`) is still
/// found, while a long reference number written without separators is judged only as a whole,
/// and passes unless it is 13 to 19 digits long and Luhn-valid.
pub fn contains_card_number(text: &str) -> bool {
    groups_runs(text).any(|groups| spans_a_card_number(&groups))
}

/// The runs of digit groups in `text`: a group is consecutive ASCII digits, and two groups
/// belong to one run when one to three spaces or dashes stand between them.
fn groups_runs(text: &str) -> impl Iterator<Item = Vec<&str>> {
    let bytes = text.as_bytes();
    let mut at = 0;
    std::iter::from_fn(move || {
        while at < bytes.len() && !bytes[at].is_ascii_digit() {
            at += 1;
        }
        if at >= bytes.len() {
            return None;
        }
        let mut groups = Vec::new();
        loop {
            let start = at;
            while at < bytes.len() && bytes[at].is_ascii_digit() {
                at += 1;
            }
            groups.push(&text[start..at]);
            let separators = bytes[at..]
                .iter()
                .take_while(|b| matches!(b, b' ' | b'-'))
                .count();
            let next_is_digit = bytes.get(at + separators).is_some_and(u8::is_ascii_digit);
            if !(MAX_SEPARATORS.contains(&separators) && next_is_digit) {
                return Some(groups);
            }
            at += separators;
        }
    })
}

/// Whether some span of whole consecutive groups has a card number's length and checksum.
///
/// A span of several groups counts only if each group is as long as the groups a card number
/// is printed in (4-4-4-4, 4-6-5, 4-4-4-4-3): a reference like `1764580000-12345` (a
/// timestamp and a counter) is two numbers, not one.
fn spans_a_card_number(groups: &[&str]) -> bool {
    let printed = |group: &&&str| PRINTED_GROUP.contains(&group.len());
    (0..groups.len()).any(|first| {
        if is_card_number(groups[first]) {
            return true;
        }
        let mut digits = String::new();
        groups[first..].iter().take_while(printed).any(|group| {
            digits.push_str(group);
            is_card_number(&digits)
        })
    })
}

fn is_card_number(digits: &str) -> bool {
    PAN_DIGITS.contains(&digits.len()) && passes_luhn(digits)
}

/// The Luhn (mod 10) check that every card number's last digit satisfies.
fn passes_luhn(digits: &str) -> bool {
    let sum: u32 = digits
        .bytes()
        .rev()
        .map(|b| u32::from(b - b'0'))
        .enumerate()
        .map(|(i, d)| match (i % 2 == 1, d * 2) {
            (true, doubled) if doubled > 9 => doubled - 9,
            (true, doubled) => doubled,
            (false, _) => d,
        })
        .sum();
    sum.is_multiple_of(10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn card_numbers_are_found_however_they_are_written() {
        for text in [
            "4111111111111111",
            "4111 1111 1111 1111",
            "4111-1111-1111-1111",
            "card 4111111111111111 exp 12/29 cvv 123",
            "card 4111 1111 1111 1111 123",
            "tok_4111111111111111",
            "378282246310005",         // American Express, 15 digits
            "6011111111111117",        // Discover
            "4222222222222",           // 13 digits
            "6304 0000 0000 0000 018", // 19-digit Maestro
            "4111  1111 1111 1111",
            "4111 - 1111 - 1111 - 1111",
        ] {
            assert!(contains_card_number(text), "{text:?}");
        }
    }

    #[test]
    fn other_numbers_are_not_card_numbers() {
        for text in [
            "",
            "tok_visa",
            "order 12345",
            "4111111111111112",                 // fails Luhn
            "411111111111",                     // 12 digits
            "41111111111111111111",             // 20 digits written together
            "4111 / 1111 1111 1111",            // not one number
            "Demo order demo-1764580000-10007", // Luhn-valid as one run: a timestamp and a counter
            "invoice 2026-12-01 for 4 items",
        ] {
            assert!(!contains_card_number(text), "{text:?}");
        }
    }

    #[test]
    fn luhn_matches_the_reference_values() {
        assert!(passes_luhn("79927398713"));
        assert!(!passes_luhn("79927398710"));
        assert!(passes_luhn("0"));
    }
}

/// Why a client's opaque reference (a card token, a bank account reference) was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReferenceRefusal {
    /// It holds a card number: the client sent the number itself (a PCI matter).
    CardNumber,
    /// It is not `prefix` and then letters, digits or underscores, at most `max_len` in all.
    Malformed,
}

/// Checks that `reference` is `prefix` and then at least one ASCII letter, digit or
/// underscore, at most `max_len` characters in all, and holds no card number (checked first,
/// so that a client that sends one is told so, not merely that the reference is malformed).
pub(crate) fn check_reference(
    reference: &str,
    prefix: &str,
    max_len: usize,
) -> Result<(), ReferenceRefusal> {
    if contains_card_number(reference) {
        return Err(ReferenceRefusal::CardNumber);
    }
    let well_formed = reference.strip_prefix(prefix).is_some_and(|rest| {
        !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    });
    if !well_formed || reference.len() > max_len {
        return Err(ReferenceRefusal::Malformed);
    }
    Ok(())
}
