//! The controller's fuzz targets (fuzz/) replayed on their committed seeds: the push channel's
//! decoder and the topology spec loader, without libFuzzer (`cargo xtask test --full` and
//! `cargo xtask fuzz` fuzz them).

#[path = "../../fuzz/checks/channel_messages.rs"]
mod channel_messages;
#[path = "../../fuzz/checks/replay.rs"]
mod replay;
#[path = "../../fuzz/checks/topology_spec_toml.rs"]
mod topology_spec_toml;

#[test]
fn channel_messages_seeds() {
    replay::replay("channel_messages", channel_messages::check);
}

#[test]
fn topology_spec_toml_seeds() {
    replay::replay("topology_spec_toml", topology_spec_toml::check);
}
