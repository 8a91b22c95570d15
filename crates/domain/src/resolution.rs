//! How an operator resolves a reconciliation exception: the three actions, which kind of
//! exception each one fits, and the note that says why.

use crate::{Description, DescriptionError, ExceptionId, ItemResult, SettlementKind};

/// What an operator does about an exception.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResolutionAction {
    /// Posts what the processor made into the books (ledger and event), once the processor
    /// confirms it.
    Record,
    /// Asks the processor to give back what it holds, under a key of the resolution's own.
    Void,
    /// Closes the exception with the note; nothing else changes.
    Accept,
}

impl ResolutionAction {
    pub const ALL: [Self; 3] = [Self::Record, Self::Void, Self::Accept];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Record => "record",
            Self::Void => "void",
            Self::Accept => "accept",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|action| action.as_str() == name)
    }

    /// Whether the action can resolve an exception of `kind` about an effect of `effect`.
    ///
    /// Only the processor's side can be recorded or voided, and only a charge's: a refund or
    /// payout posted without its charge's or balance's reservation could take more than
    /// there is, and neither can be given back by a refund. A capture or a void the books miss
    /// ended a hold behind the service's back: which of the hold's records it belongs to, and
    /// whether its money may be posted, is a person's judgement, so it is accepted (with the
    /// note that says what was done about it). Anything can be accepted.
    pub fn applies_to(self, kind: ItemResult, effect: SettlementKind) -> bool {
        let charge = effect == SettlementKind::Charge;
        match self {
            Self::Accept => kind.is_exception(),
            Self::Record => charge && kind == ItemResult::ProcessorOnly,
            Self::Void => {
                charge
                    && matches!(
                        kind,
                        ItemResult::ProcessorOnly | ItemResult::ProcessorMismatch
                    )
            }
        }
    }
}

/// A validated resolution: which exception, what to do, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolutionRequest {
    pub exception: ExceptionId,
    pub action: ResolutionAction,
    pub note: ResolutionNote,
}

/// Why the operator resolved it as they did: 1 to 500 characters, no NUL, no card number.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResolutionNote(Description);

impl ResolutionNote {
    pub fn new(text: impl Into<String>) -> Result<Self, NoteError> {
        let text = text.into();
        if text.trim().is_empty() {
            return Err(NoteError::Empty);
        }
        Description::new(text).map(Self).map_err(NoteError::Text)
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

/// Why a note was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NoteError {
    #[error("a note must say why: it may not be empty")]
    Empty,
    #[error("{0}")]
    Text(DescriptionError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn action_names_round_trip() {
        for action in ResolutionAction::ALL {
            assert_eq!(ResolutionAction::parse(action.as_str()), Some(action));
        }
        assert_eq!(ResolutionAction::parse("Record"), None);
    }

    /// One row per kind of exception and effect: the actions that fit it.
    #[test]
    fn only_a_charge_the_processor_holds_can_be_recorded_or_voided() {
        use ItemResult::*;
        use ResolutionAction::*;
        use SettlementKind::{Capture, Charge, Payout, Refund};
        let cases = [
            (ProcessorOnly, Charge, vec![Record, Void, Accept]),
            (ProcessorMismatch, Charge, vec![Void, Accept]),
            (BooksOnly, Charge, vec![Accept]),
            (AmountMismatch, Charge, vec![Accept]),
            (ProcessorOnly, Refund, vec![Accept]),
            (ProcessorOnly, Payout, vec![Accept]),
            (ProcessorOnly, Capture, vec![Accept]),
            (ProcessorOnly, SettlementKind::Void, vec![Accept]),
            (BooksOnly, Capture, vec![Accept]),
            (Matched, Charge, vec![]),
        ];
        for (kind, effect, fits) in cases {
            let found: Vec<_> = ResolutionAction::ALL
                .into_iter()
                .filter(|action| action.applies_to(kind, effect))
                .collect();
            assert_eq!(found, fits, "{kind:?} of a {effect:?}");
        }
    }

    #[test]
    fn a_note_is_not_empty_and_holds_no_card_number() {
        assert_eq!(ResolutionNote::new("  ").err(), Some(NoteError::Empty));
        assert_eq!(
            ResolutionNote::new("card 4242 4242 4242 4242").err(),
            Some(NoteError::Text(DescriptionError::CardNumber))
        );
        let note = ResolutionNote::new("made by hand at the terminal");
        assert_eq!(
            note.map(|n| n.as_str().to_owned()).ok().as_deref(),
            Some("made by hand at the terminal")
        );
    }
}
