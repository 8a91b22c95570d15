//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!` embeds the
//! migrations at compile time, and cargo does not otherwise know to look at them.

fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
