//! `sopa_build_info{role, version, node} 1`: what runs where, for a fleet's dashboards and for
//! joining other series by node.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::gauge::ConstGauge,
    registry::Registry,
};

/// This build's version (the workspace's).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The process's role: `agent`, `switch` or `controller`.
#[derive(Clone, Debug)]
struct BuildInfo {
    labels: [(&'static str, String); 3],
}

impl Collector for BuildInfo {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let gauge = ConstGauge::new(1i64);
        let mut metric = encoder.encode_descriptor(
            "sopa_build_info",
            "1, labelled with this process's role, version and node",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(metric.encode_family(&self.labels)?)
    }
}

/// Registers `sopa_build_info` for `role` on `node`.
pub fn register(registry: &mut Registry, role: &'static str, node: &str) {
    registry.register_collector(Box::new(BuildInfo {
        labels: [
            ("role", role.to_owned()),
            ("version", VERSION.to_owned()),
            ("node", node.to_owned()),
        ],
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_info_names_role_version_and_node() {
        let mut registry = Registry::default();
        register(&mut registry, "switch", "e0");
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(
            out.contains(&format!(
                "sopa_build_info{{role=\"switch\",version=\"{VERSION}\",node=\"e0\"}} 1"
            )),
            "{out}"
        );
    }
}
