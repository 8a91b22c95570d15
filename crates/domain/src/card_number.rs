//! Finding primary account numbers (card numbers) in text a client or an operator sends, so
//! that none is ever stored or logged: the service takes card tokens, and a number in a token,
//! a reference, a note, a key or a description would sit in the idempotency record, the replay
//! cache and the logs for the whole retention.
//!
//! Every field is read the same way, after normalising it, so that no spelling of a number gets
//! past: Unicode digits of any script and compatibility forms (full-width `４`, mathematical
//! `𝟒`, superscripts) are read as the ASCII digits they stand for, and any run of characters that
//! are neither letters nor digits (spaces of every kind, tabs, newlines, zero-width spaces,
//! dots, slashes, dashes, underscores) separates groups of digits. A false positive costs the
//! client a 400 that tells it why; a false negative stores a card number for the retention.

use std::borrow::Cow;
use std::ops::{Range, RangeInclusive};

/// The fewest and most digits a card number has (ISO/IEC 7812).
const PAN_DIGITS: RangeInclusive<usize> = 13..=19;
/// How many digits each group of a card number printed in three or more groups has
/// (4-4-4-4, 4-6-5, 4-4-4-4-3).
const PRINTED_GROUP: RangeInclusive<usize> = 2..=6;
/// How many digits each half of a card number written in two halves has (`42424242-42424242`).
const HALF: RangeInclusive<usize> = 2..=9;
/// A word of hex digits longer than a card number, with letters among them, is an identifier
/// (a hash, a UUID written without dashes), not a number: digits inside it are not read.
const HEX_IDENTIFIER_MIN: usize = 20;

/// Whether `text` holds something that reads as a card number: 13 to 19 digits that pass the
/// Luhn check, written together or in groups (`4111 1111 1111 1111`, `4111.1111.1111.1111`,
/// `tok_4111_1111_1111_1111`, `41111111-11111111`), in any script's digits.
///
/// Words made only of digits that follow one another, with nothing but separators between
/// them, are the groups of one run. A run holds a card number when some span of its
/// consecutive groups has a card number's length and checksum, and is one group, two halves
/// of up to 9 digits, or groups of 2 to 6 digits as cards are printed: so a number followed by
/// its security code (`4111 1111 1111 1111 123`) is still found, while a timestamp and a
/// counter (`1764580000-10007`) or the groups of a UUID (8-4-4-4-12) are not one number. In a
/// word that mixes letters and digits (`card4111111111111111`), each run of digits is judged
/// alone.
pub fn contains_card_number(text: &str) -> bool {
    may_hold_a_card_number(text) && read_card_number(text)
}

/// [`contains_card_number`] without the quick look first: every character read.
fn read_card_number(text: &str) -> bool {
    runs(text)
        .iter()
        .any(|run| card_number_spans(run).next().is_some())
}

/// A quick look at `text` that rules out most texts with no card number in them (a UUID, a
/// path, a token), in one pass over its bytes and allocating nothing. Reading a text in full
/// normalises every character and builds its runs: for a UUID key, about 12,000 of the 89,000
/// instructions of a whole replay from memory. A card number has at least 13 digits, all in
/// one run of whole-digit words or in one row of digits inside a word with letters; an ASCII
/// text with neither holds none (its characters are their own compatibility forms, and its
/// letters, digits and separators read as they are written). Any other text is read in full.
fn may_hold_a_card_number(text: &str) -> bool {
    if !text.is_ascii() {
        return true;
    }
    let fewest = *PAN_DIGITS.start();
    // The digits of the run of whole-digit words so far, of the word so far, and in a row.
    let (mut run, mut word, mut row) = (0, 0, 0);
    let mut letters = false;
    // A separator after the last byte ends the last word.
    for byte in text.bytes().chain([b' ']) {
        if byte.is_ascii_digit() {
            word += 1;
            row += 1;
            if row >= fewest {
                return true;
            }
        } else if byte.is_ascii_alphabetic() {
            letters = true;
            row = 0;
        } else {
            if letters {
                // A word with letters ends the run; its rows of digits stand alone.
                run = 0;
            } else {
                run += word;
                if run >= fewest {
                    return true;
                }
            }
            (word, row, letters) = (0, 0, false);
        }
    }
    false
}

/// `text` with every digit of every card number in it replaced by `*`, for the logs: the rest
/// (where the client put it, what surrounds it) stays readable. Borrowed when there is none.
pub fn mask_card_numbers(text: &str) -> Cow<'_, str> {
    if !may_hold_a_card_number(text) {
        return Cow::Borrowed(text);
    }
    let mut masked: Vec<Range<usize>> = runs(text)
        .iter()
        .flat_map(|run| {
            card_number_spans(run)
                .flat_map(|span| {
                    span.iter()
                        .flat_map(|group| group.iter().map(|d| d.at.clone()))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    if masked.is_empty() {
        return Cow::Borrowed(text);
    }
    masked.sort_by_key(|at| at.start);
    masked.dedup();
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    for at in masked {
        out.push_str(&text[from..at.start]);
        out.push('*');
        from = at.end;
    }
    out.push_str(&text[from..]);
    Cow::Owned(out)
}

/// One digit as read, and where the character it was read from stands in the text.
#[derive(Debug, Clone)]
struct Digit {
    value: u8,
    at: Range<usize>,
}

/// Consecutive digits of one word.
type Group = Vec<Digit>;

/// What one character (after its compatibility decomposition) is to the reader.
enum Read {
    Digit(u8),
    Letter,
    Separator,
}

/// The runs of digit groups in `text`, in order.
fn runs(text: &str) -> Vec<Vec<Group>> {
    let mut runs = Runs::default();
    let mut word: Vec<Char> = Vec::new();
    // One character's compatibility decomposition (`⒈` is `1` and `.`), reused for each.
    let mut reads = Vec::new();
    for (at, c) in text.char_indices() {
        let span = at..at + c.len_utf8();
        unicode_normalization::char::decompose_compatible(c, |d| reads.push(read(d)));
        for r in reads.drain(..) {
            match r {
                Read::Separator => runs.end_word(&mut word),
                r => word.push((r, span.clone(), c)),
            }
        }
    }
    runs.end_word(&mut word);
    runs.finish()
}

/// A character of a word as read, where it stands, and the character as written.
type Char = (Read, Range<usize>, char);

/// The runs found so far, and the run of whole-digit words being built.
#[derive(Default)]
struct Runs {
    done: Vec<Vec<Group>>,
    building: Vec<Group>,
}

impl Runs {
    /// Takes in a word that has ended (a separator, or the end of the text), and clears it.
    fn end_word(&mut self, word: &mut Vec<Char>) {
        if word.is_empty() {
            return;
        }
        if word
            .iter()
            .all(|(read, _, _)| matches!(read, Read::Digit(_)))
        {
            self.building.push(digits_of(word));
        } else {
            // Letters end the run, and each run of digits inside this word stands alone.
            self.end_run();
            if !is_hex_identifier(word) {
                for part in word.split(|(read, _, _)| matches!(read, Read::Letter)) {
                    if !part.is_empty() {
                        self.done.push(vec![digits_of(part)]);
                    }
                }
            }
        }
        word.clear();
    }

    fn end_run(&mut self) {
        if !self.building.is_empty() {
            self.done.push(std::mem::take(&mut self.building));
        }
    }

    fn finish(mut self) -> Vec<Vec<Group>> {
        self.end_run();
        self.done
    }
}

fn digits_of(part: &[Char]) -> Group {
    part.iter()
        .filter_map(|(read, at, _)| match read {
            Read::Digit(value) => Some(Digit {
                value: *value,
                at: at.clone(),
            }),
            _ => None,
        })
        .collect()
}

fn is_hex_identifier(word: &[Char]) -> bool {
    word.len() >= HEX_IDENTIFIER_MIN
        && word.iter().all(|(_, _, c)| c.is_ascii_hexdigit())
        && word.iter().any(|(_, _, c)| c.is_ascii_alphabetic())
}

fn read(c: char) -> Read {
    if let Some(value) = decimal_digit(c) {
        Read::Digit(value)
    } else if c.is_alphanumeric() {
        Read::Letter
    } else {
        Read::Separator
    }
}

/// The value of a decimal digit of any script (Unicode category Nd), whose digits always
/// stand in blocks of ten from a zero.
fn decimal_digit(c: char) -> Option<u8> {
    let code = u32::from(c);
    let zero = match DECIMAL_ZEROS.binary_search(&code) {
        Ok(at) => DECIMAL_ZEROS[at],
        Err(0) => return None,
        Err(after) => DECIMAL_ZEROS[after - 1],
    };
    u8::try_from(code - zero).ok().filter(|value| *value < 10)
}

/// The zero of every block of decimal digits (Unicode 14, category Nd): ASCII, Arabic-Indic,
/// Devanagari, Thai, full-width, mathematical and the rest.
const DECIMAL_ZEROS: [u32; 66] = [
    0x30, 0x660, 0x6F0, 0x7C0, 0x966, 0x9E6, 0xA66, 0xAE6, 0xB66, 0xBE6, 0xC66, 0xCE6, 0xD66,
    0xDE6, 0xE50, 0xED0, 0xF20, 0x1040, 0x1090, 0x17E0, 0x1810, 0x1946, 0x19D0, 0x1A80, 0x1A90,
    0x1B50, 0x1BB0, 0x1C40, 0x1C50, 0xA620, 0xA8D0, 0xA900, 0xA9D0, 0xA9F0, 0xAA50, 0xABF0, 0xFF10,
    0x104A0, 0x10D30, 0x11066, 0x110F0, 0x11136, 0x111D0, 0x112F0, 0x11450, 0x114D0, 0x11650,
    0x116C0, 0x11730, 0x118E0, 0x11950, 0x11C50, 0x11D50, 0x11DA0, 0x16A60, 0x16AC0, 0x16B50,
    0x1D7CE, 0x1D7D8, 0x1D7E2, 0x1D7EC, 0x1D7F6, 0x1E140, 0x1E2F0, 0x1E950, 0x1FBF0,
];

/// The spans of consecutive groups in `run` that read as a card number.
fn card_number_spans(run: &[Group]) -> impl Iterator<Item = &[Group]> {
    (0..run.len()).flat_map(move |first| {
        (first + 1..=run.len())
            .map(move |end| &run[first..end])
            .take_while(|span| span.iter().map(Vec::len).sum::<usize>() <= *PAN_DIGITS.end())
            .filter(|span| is_written_as_a_card_number(span) && is_card_number(span))
    })
}

/// Whether a span of groups is laid out as a card number is: one group, two halves, or groups
/// as cards are printed.
fn is_written_as_a_card_number(span: &[Group]) -> bool {
    match span {
        [_] => true,
        [first, second] => HALF.contains(&first.len()) && HALF.contains(&second.len()),
        groups => groups
            .iter()
            .all(|group| PRINTED_GROUP.contains(&group.len())),
    }
}

fn is_card_number(span: &[Group]) -> bool {
    let digits: Vec<u8> = span.iter().flatten().map(|digit| digit.value).collect();
    PAN_DIGITS.contains(&digits.len()) && passes_luhn(&digits)
}

/// The Luhn (mod 10) check that every card number's last digit satisfies.
fn passes_luhn(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .map(|d| u32::from(*d))
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

    /// Every spelling the second security review got past the first filter, and the ones it
    /// already caught.
    const SPELLINGS: [&str; 16] = [
        "4242.4242.4242.4242",
        "4242/4242/4242/4242",
        "4242\t4242\t4242\t4242",
        "4242\n4242\n4242\n4242",
        "4242\u{a0}4242\u{a0}4242\u{a0}4242",
        "4242\u{200b}4242\u{200b}4242\u{200b}4242",
        "4242    4242    4242    4242",
        "4242_4242_4242_4242",
        "42424242-42424242",
        "４２４２４２４２４２４２４２４２",
        "٤٢٤٢ ٤٢٤٢ ٤٢٤٢ ٤٢٤٢",
        "𝟒𝟐𝟒𝟐𝟒𝟐𝟒𝟐𝟒𝟐𝟒𝟐𝟒𝟐𝟒𝟐",
        "4242424242424242",
        "4242 4242 4242 4242",
        "4242-4242-4242-4242",
        "4242 - 4242 - 4242 - 4242",
    ];

    #[test]
    fn card_numbers_are_found_however_they_are_written() {
        for text in SPELLINGS.iter().copied().chain([
            "4111111111111111",
            "card 4111111111111111 exp 12/29 cvv 123",
            "card 4111 1111 1111 1111 123",
            "tok_4111111111111111",
            "tok_4242_4242_4242_4242",
            "ba_4242_4242_4242_4242",
            "card4111111111111111exp",
            "378282246310005",         // American Express, 15 digits
            "3782 822463 10005",       // American Express as printed, 4-6-5
            "6011111111111117",        // Discover
            "4222222222222",           // 13 digits
            "6304 0000 0000 0000 018", // 19-digit Maestro
            "4111  1111 1111 1111",
        ]) {
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
            "4111 x 1111 1111 1111",            // a letter between: not one number
            "Demo order demo-1764580000-10007", // Luhn-valid as one run: a timestamp and a counter
            "invoice 2026-12-01 for 4 items",
            // A SHA-256 in hex whose digit runs would otherwise be read.
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        ] {
            assert!(!contains_card_number(text), "{text:?}");
        }
    }

    /// Idempotency keys and request ids are most often UUIDs, in either form: none of them may
    /// be refused as a card number, by the quick look or read in full. 100,000 random ones,
    /// each in both forms.
    #[test]
    fn no_uuid_is_a_card_number() {
        for _ in 0..100_000 {
            let uuid = uuid::Uuid::new_v4();
            for text in [uuid.hyphenated().to_string(), uuid.simple().to_string()] {
                assert!(!contains_card_number(&text), "{text}");
                assert!(!read_card_number(&text), "{text}, read in full");
            }
        }
    }

    /// The quick look never rules out a text that holds a card number: on 100,000 random ASCII
    /// texts (groups of digits of every length, words with letters, separators, put together
    /// at random; one in ten holds a card number), it agrees with reading every character, and
    /// it is what answers for most of the others.
    #[test]
    fn the_quick_look_never_rules_out_a_card_number() {
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |below: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % below
        };
        let (mut found, mut ruled_out) = (0, 0);
        for _ in 0..100_000 {
            let mut text = String::new();
            for _ in 0..1 + next(6) {
                let (alphabet, len): (&[u8], _) = match next(5) {
                    0 => (b"0123456789abcfx", 1 + next(12)),
                    _ => (b"0123456789", 1 + next(19)),
                };
                text.extend(
                    (0..len).map(|_| char::from(alphabet[next(alphabet.len() as u64) as usize])),
                );
                let separators = [" ", "-", ".", "_", "/", " - ", ""];
                text.push_str(separators[next(separators.len() as u64) as usize]);
            }
            let held = read_card_number(&text);
            assert_eq!(contains_card_number(&text), held, "{text:?}");
            let masked = mask_card_numbers(&text);
            assert_eq!(
                masked != text.as_str(),
                held,
                "{text:?} masked as {masked:?}"
            );
            found += usize::from(held);
            ruled_out += usize::from(!may_hold_a_card_number(&text));
        }
        assert!(found > 5_000, "only {found} texts held a card number");
        assert!(
            ruled_out > 20_000,
            "the quick look ruled out only {ruled_out}"
        );
        for text in SPELLINGS {
            assert!(may_hold_a_card_number(text), "{text:?}");
        }
        let uuid = "6f1c2e4a-0d1b-4c3e-9f7a-2b5d8e6c1a90";
        assert!(!may_hold_a_card_number(uuid) && !may_hold_a_card_number("/charges"));
    }

    #[test]
    fn masking_hides_the_digits_of_a_card_number_and_nothing_else() {
        assert_eq!(mask_card_numbers("order 12345"), "order 12345");
        assert!(matches!(mask_card_numbers("order 12345"), Cow::Borrowed(_)));
        assert_eq!(
            mask_card_numbers("/charges/4000056655665556"),
            "/charges/****************"
        );
        assert_eq!(
            mask_card_numbers("id 4242.4242.4242.4242 ok 7"),
            "id ****.****.****.**** ok 7"
        );
        assert_eq!(
            mask_card_numbers("４２４２４２４２４２４２４２４２"),
            "****************"
        );
        for text in SPELLINGS {
            let masked = mask_card_numbers(text);
            assert!(!contains_card_number(&masked), "{text:?} -> {masked:?}");
            assert!(!masked.contains("4242"), "{masked:?}");
        }
    }

    #[test]
    fn digits_of_every_script_are_read_as_digits() {
        assert_eq!(decimal_digit('7'), Some(7));
        assert_eq!(decimal_digit('٧'), Some(7)); // Arabic-Indic
        assert_eq!(decimal_digit('७'), Some(7)); // Devanagari
        assert_eq!(decimal_digit('７'), Some(7)); // full-width
        assert_eq!(decimal_digit('a'), None);
        assert_eq!(decimal_digit('/'), None);
        assert_eq!(decimal_digit(':'), None);
    }

    #[test]
    fn luhn_matches_the_reference_values() {
        let digits = |s: &str| s.bytes().map(|b| b - b'0').collect::<Vec<_>>();
        assert!(passes_luhn(&digits("79927398713")));
        assert!(!passes_luhn(&digits("79927398710")));
        assert!(passes_luhn(&digits("0")));
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
