//! Mutual TLS for the channel (rustls through tonic): `sopactl certs init DIR` makes a CA and
//! controller and agent certificates for tests and small deployments; the controller accepts
//! only clients whose certificate chains to its CA, and agents accept only a controller whose
//! certificate does.
//!
//! Files in a certificate folder: `ca.pem`, `controller.pem`, `controller.key`, `agent.pem`,
//! `agent.key` (the CA's key, `ca.key`, stays there only to issue more; keep it offline).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{0} already exists; remove it or choose another folder (certificates are never overwritten)"
    )]
    Exists(PathBuf),
    #[error("generating certificates: {0}")]
    Generate(#[from] rcgen::Error),
}

pub const CA: &str = "ca.pem";
pub const CA_KEY: &str = "ca.key";
pub const CONTROLLER: (&str, &str) = ("controller.pem", "controller.key");
pub const AGENT: (&str, &str) = ("agent.pem", "agent.key");

/// The name agents expect in the controller's certificate by default.
pub const CONTROLLER_NAME: &str = "sopa-controller";

fn read(dir: &Path, name: &str) -> Result<Vec<u8>, TlsError> {
    let path = dir.join(name);
    std::fs::read(&path).map_err(|source| TlsError::Io { path, source })
}

/// Options of a generated certificate set.
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// Names and addresses the controller's certificate is valid for.
    pub controller_names: Vec<String>,
    /// Issue already-expired leaf certificates (for tests of the refusal).
    pub expired: bool,
}

impl Default for InitOptions {
    fn default() -> Self {
        Self {
            controller_names: vec![
                CONTROLLER_NAME.into(),
                "localhost".into(),
                "127.0.0.1".into(),
            ],
            expired: false,
        }
    }
}

/// Writes a new CA and controller and agent certificates into `dir`; refuses to overwrite.
pub fn init(dir: &Path, opts: &InitOptions) -> Result<Vec<PathBuf>, TlsError> {
    let names = [CA, CA_KEY, CONTROLLER.0, CONTROLLER.1, AGENT.0, AGENT.1];
    for n in names {
        let p = dir.join(n);
        if p.exists() {
            return Err(TlsError::Exists(p));
        }
    }
    std::fs::create_dir_all(dir).map_err(|source| TlsError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca_params.distinguished_name = name("SOPA fabric CA");
    let ca_key = KeyPair::generate()?;
    let ca_key_pem = ca_key.serialize_pem();
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key)?;
    let leaf = |sans: Vec<String>,
                cn: &str,
                usage: ExtendedKeyUsagePurpose|
     -> Result<(String, String), TlsError> {
        let mut p = CertificateParams::new(sans)?;
        p.distinguished_name = name(cn);
        p.extended_key_usages = vec![usage];
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if opts.expired {
            p.not_before = rcgen::date_time_ymd(2000, 1, 1);
            p.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let key = KeyPair::generate()?;
        let cert = p.signed_by(&key, &ca)?;
        Ok((cert.pem(), key.serialize_pem()))
    };
    let controller = leaf(
        opts.controller_names.clone(),
        CONTROLLER_NAME,
        ExtendedKeyUsagePurpose::ServerAuth,
    )?;
    let agent = leaf(
        vec!["sopa-agent".into()],
        "sopa-agent",
        ExtendedKeyUsagePurpose::ClientAuth,
    )?;
    let files = [
        (CA, ca.pem()),
        (CA_KEY, ca_key_pem),
        (CONTROLLER.0, controller.0),
        (CONTROLLER.1, controller.1),
        (AGENT.0, agent.0),
        (AGENT.1, agent.1),
    ];
    let mut written = Vec::new();
    for (n, contents) in files {
        let path = dir.join(n);
        write_private(&path, contents.as_bytes(), n.ends_with(".key"))?;
        written.push(path);
    }
    Ok(written)
}

fn write_private(path: &Path, bytes: &[u8], secret: bool) -> Result<(), TlsError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true)
        .create_new(true)
        .mode(if secret { 0o600 } else { 0o644 });
    let mut f = opts.open(path).map_err(|source| TlsError::Io {
        path: path.to_owned(),
        source,
    })?;
    std::io::Write::write_all(&mut f, bytes).map_err(|source| TlsError::Io {
        path: path.to_owned(),
        source,
    })
}

fn name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn.push(DnType::OrganizationName, "SOPA");
    dn
}

/// The controller's TLS: its identity, and the CA every client certificate must chain to.
pub fn server_config(dir: &Path) -> Result<ServerTlsConfig, TlsError> {
    let identity = Identity::from_pem(read(dir, CONTROLLER.0)?, read(dir, CONTROLLER.1)?);
    Ok(ServerTlsConfig::new()
        .identity(identity)
        .client_ca_root(Certificate::from_pem(read(dir, CA)?)))
}

/// An agent's TLS: the CA the controller's certificate must chain to, the agent's identity, and
/// the name expected in the controller's certificate.
pub fn client_config(dir: &Path, controller_name: &str) -> Result<ClientTlsConfig, TlsError> {
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(dir, CA)?))
        .identity(Identity::from_pem(read(dir, AGENT.0)?, read(dir, AGENT.1)?))
        .domain_name(controller_name))
}
