//! The configuration file (`PAYMENTS_CONFIG`) and the errors of reading the configuration,
//! which must never print a value: the line a TOML parser quotes may be
//! `url = "postgres://payments:password@…"` or `cache_secret = "…"`. An error names the file,
//! the line and the key; a value of the wrong type names the key and what it should be.

use config::ConfigError;

use crate::config::StartupError;

/// The setting whose file an error is about.
const SETTING: &str = "PAYMENTS_CONFIG";

/// Checks that the file at `path` is readable TOML, before the configuration layers read it.
pub(crate) fn check(path: &str) -> Result<(), StartupError> {
    let text = std::fs::read_to_string(path).map_err(|e| StartupError::Invalid {
        key: SETTING,
        reason: format!("{path:?} is not a readable file ({})", e.kind()),
    })?;
    match toml::from_str::<toml::Table>(&text) {
        Ok(_) => Ok(()),
        Err(e) => Err(StartupError::Invalid {
            key: SETTING,
            reason: syntax_error(path, &text, e.span().map_or(0, |span| span.start)),
        }),
    }
}

/// "`path`, line N (key `a.b`): not valid TOML", for an error at byte `at` of `text`.
fn syntax_error(path: &str, text: &str, at: usize) -> String {
    let at = at.min(text.len());
    let line = text[..at].matches('\n').count() + 1;
    match key_of_line(text, line) {
        Some(key) => format!(
            "{path:?}, line {line} (key {key}): not valid TOML; check the quotes and brackets of \
             its value (not shown: it may be a secret)"
        ),
        None => format!(
            "{path:?}, line {line}: not valid TOML (the line is not shown: it may hold a secret)"
        ),
    }
}

/// The dotted key that line `line` (1-based) of `text` sets, with the `[table]` it is in: the
/// text before its `=`, if that reads as a key.
fn key_of_line(text: &str, line: usize) -> Option<String> {
    let is_key = |key: &str| {
        !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    };
    let lines: Vec<&str> = text.lines().collect();
    let (name, _value) = lines.get(line - 1)?.split_once('=')?;
    let name = name.trim();
    if !is_key(name) {
        return None;
    }
    let table = lines[..line - 1].iter().rev().find_map(|above| {
        let header = above.trim().strip_prefix('[')?.split(']').next()?;
        Some(header.trim_start_matches('[').trim())
    });
    Some(match table {
        Some(table) if is_key(table) => format!("{table}.{name}"),
        _ => name.to_owned(),
    })
}

/// A loading error as one line without the value at fault.
pub(crate) fn load_error(error: ConfigError) -> StartupError {
    StartupError::Load(describe(&error, None))
}

fn describe(error: &ConfigError, at_key: Option<&str>) -> String {
    match error {
        ConfigError::Type {
            origin,
            expected,
            key,
            ..
        } => {
            let key = key.as_deref().or(at_key).unwrap_or("a setting");
            match origin {
                Some(origin) => format!("{key} must be {expected} (in {origin})"),
                None => format!("{key} must be {expected}"),
            }
        }
        ConfigError::At { error, key, .. } => describe(error, key.as_deref().or(at_key)),
        ConfigError::FileParse { uri, .. } => format!(
            "{} is not valid TOML",
            uri.as_deref().unwrap_or("a configuration file")
        ),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BROKEN: &str = "[server]\nbind = \"127.0.0.1:8080\"\n\n[database]\n\
                          url = \"postgres://postgres:SuperSecret@db/payments\n\
                          max_connections = 10\n";

    #[test]
    fn a_syntax_error_names_the_file_line_and_key_and_never_the_value() {
        let error = toml::from_str::<toml::Table>(BROKEN).expect_err("broken");
        let at = error.span().map_or(0, |span| span.start);
        let message = syntax_error("payments.toml", BROKEN, at);
        assert!(message.contains("\"payments.toml\", line 5"), "{message}");
        assert!(message.contains("key database.url"), "{message}");
        assert!(!message.contains("SuperSecret"), "{message}");
        assert!(!message.contains("postgres:"), "{message}");
    }

    #[test]
    fn a_line_that_is_not_a_key_is_named_by_its_number_alone() {
        let text = "[redis]\ncache_secret \"0123456789abcdef\"\n";
        let message = syntax_error("c.toml", text, text.find("cache").expect("line"));
        assert_eq!(
            message,
            "\"c.toml\", line 2: not valid TOML (the line is not shown: it may hold a secret)"
        );
    }
}
