//! `sopa_certificate_expiry_timestamp_seconds{role}`: when the process's own certificate stops
//! being valid, read at every scrape (a renewed certificate shows at once), so an alert can
//! fire days before the channel would refuse it.

use std::{path::PathBuf, sync::Arc};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::gauge::ConstGauge,
    registry::Registry,
};

/// Reads a certificate file's `notAfter` in Unix seconds.
pub type NotAfter = Arc<dyn Fn(&std::path::Path) -> Option<i64> + Send + Sync>;

struct CertExpiry {
    role: &'static str,
    path: PathBuf,
    read: NotAfter,
}

impl std::fmt::Debug for CertExpiry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertExpiry")
            .field("path", &self.path)
            .finish()
    }
}

impl Collector for CertExpiry {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        // A certificate that cannot be read is left out (its absence alerts nobody, but the
        // channel's own refusal does).
        let Some(at) = (self.read)(&self.path) else {
            return Ok(());
        };
        let gauge = ConstGauge::new(at);
        let mut metric = encoder.encode_descriptor(
            "sopa_certificate_expiry_timestamp_seconds",
            "When this process's own certificate expires (Unix seconds)",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(metric.encode_family(&[("role", self.role)])?)
    }
}

/// Registers the expiry of the certificate at `path` (a node's `node.pem`) for `role`.
pub fn register(registry: &mut Registry, role: &'static str, path: PathBuf, read: NotAfter) {
    registry.register_collector(Box::new(CertExpiry { role, path, read }));
}
