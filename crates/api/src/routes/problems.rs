//! `GET /problems/{code}`: the documentation every problem's `type` links to. Each code's is
//! its row of `docs/errors.md`, embedded when the service is built, under the heading that
//! says what a caller does with it.

use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use axum::http::header;
use axum::response::IntoResponse;

use crate::ApiError;

/// `docs/errors.md`, at the root of the repository.
const ERRORS: &str = include_str!("../../../../docs/errors.md");

/// The `type` of the problems of `code`: a URI reference, resolved against the service's own
/// address, to [`show`].
pub(crate) fn type_of(code: &str) -> String {
    format!("/problems/{code}")
}

/// The documentation of `code` as Markdown, if `docs/errors.md` has a row for it.
pub(crate) fn documentation(code: &str) -> Option<String> {
    let mut heading = "";
    for line in ERRORS.lines() {
        if let Some(text) = line.strip_prefix("## ") {
            heading = text;
            continue;
        }
        let Some((name, rest)) = line
            .strip_prefix("| `")
            .and_then(|row| row.split_once("` | "))
        else {
            continue;
        };
        if name != code {
            continue;
        }
        let (status, what) = rest.trim_end_matches(" |").split_once(" | ")?;
        return Some(format!(
            "# `{code}`\n\nStatus {status}: {what}.\n\n{heading}.\n\n\
             Every code, and what a caller does with each: docs/errors.md in the repository.\n"
        ));
    }
    None
}

pub(super) async fn show(
    code: Result<Path<String>, PathRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let not_found = || ApiError::NotFound("No such problem type.".into());
    let Path(code) = code.map_err(|_| not_found())?;
    let text = documentation(&code).ok_or_else(not_found)?;
    Ok((
        [(header::CONTENT_TYPE, "text/markdown; charset=utf-8")],
        text,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_is_documented_under_what_a_caller_does_with_it() {
        let text = documentation("idempotency_key_reused").expect("documented");
        assert!(text.starts_with("# `idempotency_key_reused`\n\nStatus 422: "));
        assert!(text.contains("The key holds another request."));
        assert_eq!(documentation("no_such_code"), None);
        assert_eq!(documentation(""), None);
    }
}
