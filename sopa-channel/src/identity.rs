//! Who a certificate speaks for. Every certificate the fabric's CA issues names one node and
//! its role in a URI subject alternative name, `sopa://ROLE/NODE` (`sopa://host/h0`,
//! `sopa://switch/e0`, `sopa://operator/alice`), as SPIFFE IDs name workloads. The controller
//! takes a client's identity from the certificate it verified, never from what the client says.

use std::{fmt, str::FromStr};

/// The scheme of an identity URI.
pub const SCHEME: &str = "sopa://";

/// The longest node name an identity (and a hello) may carry.
pub const MAX_NODE_LEN: usize = 64;

/// What a certificate's holder may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// A host agent: streams its own node's state, reports its own flows.
    Host,
    /// A switch agent: streams its own node's state, reports its own ports.
    Switch,
    /// A person or tool that may change link and switch states.
    Operator,
    /// A person or tool that may read the controller's status.
    Viewer,
    /// The controller itself (its serving certificate).
    Controller,
}

impl Role {
    pub const ALL: [Role; 5] = [
        Role::Host,
        Role::Switch,
        Role::Operator,
        Role::Viewer,
        Role::Controller,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Host => "host",
            Role::Switch => "switch",
            Role::Operator => "operator",
            Role::Viewer => "viewer",
            Role::Controller => "controller",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = IdentityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| IdentityError::Role(s.to_owned()))
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    #[error("{0:?} is not a SOPA identity; it must read sopa://ROLE/NODE")]
    NotSopa(String),
    #[error("unknown role {0:?}: use host, switch, operator, viewer or controller")]
    Role(String),
    #[error(
        "node name {0:?}: use 1 to {MAX_NODE_LEN} letters, digits, '.', '-' or '_', starting with a letter or digit"
    )]
    Node(String),
}

/// Whether `name` may name a node: 1 to 64 ASCII letters, digits, `.`, `-` or `_`, starting
/// with a letter or digit (so it is safe in a URI, a file name and a log line).
pub fn valid_node(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NODE_LEN
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

/// A node and its role, as a certificate of the fabric's CA states them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    pub role: Role,
    pub node: String,
}

impl Identity {
    pub fn new(role: Role, node: impl Into<String>) -> Result<Self, IdentityError> {
        let node = node.into();
        if !valid_node(&node) {
            return Err(IdentityError::Node(node));
        }
        Ok(Self { role, node })
    }

    /// `sopa://ROLE/NODE`.
    pub fn uri(&self) -> String {
        format!("{SCHEME}{}/{}", self.role, self.node)
    }

    /// Parses `sopa://ROLE/NODE`.
    pub fn from_uri(uri: &str) -> Result<Self, IdentityError> {
        let rest = uri
            .strip_prefix(SCHEME)
            .ok_or_else(|| IdentityError::NotSopa(uri.to_owned()))?;
        let (role, node) = rest
            .split_once('/')
            .ok_or_else(|| IdentityError::NotSopa(uri.to_owned()))?;
        Self::new(role.parse()?, node)
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.role, self.node)
    }
}

/// A certificate serial as the deny list and `sopactl` write it: lowercase hex, no leading
/// zeros.
pub fn serial_hex(bytes: &[u8]) -> String {
    let s: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let t = s.trim_start_matches('0');
    if t.is_empty() { "0".into() } else { t.into() }
}

/// The end of a certificate's validity (`notAfter`), in Unix seconds, from the first
/// certificate of the PEM file `path`; `None` where it cannot be read.
pub fn not_after(path: &std::path::Path) -> Option<i64> {
    use tokio_rustls::rustls::pki_types::{CertificateDer, pem::PemObject as _};
    let der = CertificateDer::pem_file_iter(path).ok()?.next()?.ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    Some(cert.validity().not_after.timestamp())
}

/// Reads the identity and serial of a certificate (DER): its one `sopa://ROLE/NODE` URI
/// subject alternative name.
pub fn certificate_identity(der: &[u8]) -> Result<(Identity, String), String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("the certificate does not parse: {e}"))?;
    let serial = serial_hex(cert.tbs_certificate.raw_serial());
    let san = cert
        .tbs_certificate
        .subject_alternative_name()
        .map_err(|e| format!("its subject alternative names do not parse: {e}"))?
        .ok_or("it has no subject alternative name naming a SOPA node")?;
    let uris: Vec<&str> = san
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::URI(u) if u.starts_with(SCHEME) => Some(*u),
            _ => None,
        })
        .collect();
    match uris.as_slice() {
        [one] => Identity::from_uri(one)
            .map(|id| (id, serial))
            .map_err(|e| e.to_string()),
        [] => Err("it names no SOPA node (no sopa://ROLE/NODE URI)".into()),
        _ => Err(format!("it names more than one SOPA node: {uris:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_round_trip_and_bad_ones_name_the_problem() {
        for role in Role::ALL {
            let id = Identity::new(role, "e0-1.pod_2").unwrap();
            assert_eq!(Identity::from_uri(&id.uri()), Ok(id));
        }
        assert_eq!(
            Identity::from_uri("sopa://host/h0").unwrap().to_string(),
            "host/h0"
        );
        assert_eq!(
            Identity::from_uri("spiffe://host/h0"),
            Err(IdentityError::NotSopa("spiffe://host/h0".into()))
        );
        assert_eq!(
            Identity::from_uri("sopa://host"),
            Err(IdentityError::NotSopa("sopa://host".into()))
        );
        assert_eq!(
            Identity::from_uri("sopa://admin/h0"),
            Err(IdentityError::Role("admin".into()))
        );
        for bad in ["", "-h0", "h0/x", "h 0", "h0\n", &"h".repeat(65)] {
            assert_eq!(
                Identity::new(Role::Host, bad),
                Err(IdentityError::Node(bad.to_owned())),
                "{bad:?}"
            );
        }
        assert!(valid_node(&"h".repeat(64)));
    }
}
