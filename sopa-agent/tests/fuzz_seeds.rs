//! The agent's fuzz target (fuzz/) replayed on its committed seeds: the path table loader,
//! without libFuzzer (`cargo xtask test --full` and `cargo xtask fuzz` fuzz it).

#[path = "../../fuzz/checks/path_table_toml.rs"]
mod path_table_toml;
#[path = "../../fuzz/checks/replay.rs"]
mod replay;

#[test]
fn path_table_toml_seeds() {
    replay::replay("path_table_toml", path_table_toml::check);
}
