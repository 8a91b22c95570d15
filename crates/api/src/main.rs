//! The `payments-api` binary: everything lives in the library so tests build the same app.
//!
//! `payments-api` serves; `payments-api events tail` follows the event stream;
//! `payments-api reconcile --date YYYY-MM-DD [--json]` reconciles a day against the
//! processor's settlement report.

use std::fmt::Display;
use std::process::ExitCode;

use payments_api::Reconciled;

/// mimalloc rather than the system's allocator: a request allocates and frees about a hundred
/// small blocks, often on another worker thread than the one that allocated them, which
/// glibc's arenas handle at about three times the instructions.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str = "usage: payments-api [events tail | reconcile --date YYYY-MM-DD [--json]]";

/// `reconcile`'s exit status when the run kept exceptions (1 is any error, 2 a usage error).
const EXCEPTIONS: u8 = 3;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        [] => ended(payments_api::run().await.map(|()| ExitCode::SUCCESS)),
        ["events", "tail"] => ended(
            payments_api::tail_events()
                .await
                .map(|()| ExitCode::SUCCESS),
        ),
        ["reconcile", rest @ ..] => {
            let Some((date, json)) = reconcile_args(rest) else {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            };
            ended(
                payments_api::reconcile(date, json)
                    .await
                    .map(|run| match run {
                        Reconciled::Clean => ExitCode::SUCCESS,
                        Reconciled::Exceptions => ExitCode::from(EXCEPTIONS),
                    }),
            )
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// `--date YYYY-MM-DD` (or `--date=`), and `--json`, in any order.
fn reconcile_args(args: &[&str]) -> Option<(chrono::NaiveDate, bool)> {
    let (mut date, mut json) = (None, false);
    let mut args = args.iter();
    while let Some(&arg) = args.next() {
        match arg {
            "--json" => json = true,
            "--date" => date = Some(args.next()?.parse().ok()?),
            _ => date = Some(arg.strip_prefix("--date=")?.parse().ok()?),
        }
    }
    Some((date?, json))
}

/// One line naming what is wrong; no backtrace for an operator's mistake.
fn ended<E: Display>(result: Result<ExitCode, E>) -> ExitCode {
    result.unwrap_or_else(|error| {
        eprintln!("payments-api: {error}");
        ExitCode::FAILURE
    })
}
