//! The process: where it listens, how it refuses bad settings, how it stops.

use std::process::Stdio;
use std::time::Duration;

use payments_domain::{CardProcessor, ProcessorChargeStatus};
use tokio::process::Command;

use crate::helpers::{PATIENT, REACH, request, spawn_sim_with, spawn_slow_sim, usd};

#[tokio::test]
async fn the_bind_address_can_come_from_the_environment() {
    let sim = spawn_sim_with(&[], &[("CARD_SIM_BIND", "127.0.0.1:0")]).await;
    let health = sim
        .http()
        .get(sim.url("/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.status(), reqwest::StatusCode::OK);
    assert!(!sim.base_url.ends_with(":0"), "{}", sim.base_url);
}

#[tokio::test]
async fn bad_settings_stop_start_up_with_a_message_naming_them() {
    for (variable, value) in [
        ("CARD_SIM_LATENCY_MS", "soon"),
        ("CARD_SIM_KEY_WINDOW_SECS", "a week"),
        ("CARD_SIM_KEY_WINDOW_SECS", "0"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_card-sim"))
            .args(["--bind", "127.0.0.1:0"])
            .env_clear()
            .env(variable, value)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output()
            .await
            .expect("run card-sim");

        assert!(!output.status.success(), "{variable}={value}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        // One line, naming the variable.
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.contains(variable), "{stderr}");
        assert!(output.stdout.is_empty());
    }
}

#[tokio::test]
async fn a_valid_key_window_starts_the_server() {
    let sim = spawn_sim_with(
        &["--bind", "127.0.0.1:0"],
        &[("CARD_SIM_KEY_WINDOW_SECS", "86400")],
    )
    .await;
    let charge = sim
        .processor(PATIENT)
        .charge(request("k", "tok_visa"))
        .await;
    assert_eq!(charge.map(|c| c.money), Ok(usd(1999)));
}

/// SIGTERM drains: a charge in flight still gets its answer, then the process exits cleanly.
#[cfg(unix)]
#[tokio::test]
async fn sigterm_finishes_the_charge_in_flight_then_exits_cleanly() {
    let mut sim = spawn_slow_sim().await;
    let processor = sim.processor(PATIENT);
    let in_flight = tokio::spawn(async move { processor.charge(request("k", "tok_visa")).await });
    // The charge reaches the simulator well within `REACH`; it then processes for `LATENCY`,
    // so it is still in flight when the signal arrives.
    tokio::time::sleep(REACH).await;

    let pid = sim.child.id().expect("running child").to_string();
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("run kill");
    assert!(kill.success());

    let charge = in_flight
        .await
        .expect("join")
        .expect("the charge in flight");
    assert_eq!(charge.money, usd(1999));
    assert_eq!(charge.status, ProcessorChargeStatus::Succeeded);
    let status = tokio::time::timeout(Duration::from_secs(10), sim.child.wait())
        .await
        .expect("card-sim exits after SIGTERM")
        .expect("wait");
    assert!(status.success(), "{status:?}");
}
