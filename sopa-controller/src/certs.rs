//! The fabric's certificates: `sopactl certs init DIR` makes the CA (`ca.pem`, `ca.key`), and
//! `sopactl certs issue` one certificate per node, its node and role in a URI SAN
//! (`sopa://host/h0`, see [`sopa_channel::identity`]), written with the CA certificate into a
//! folder of its own (`ca.pem`, `node.pem`, `node.key`) that is all that node ever needs. The
//! CA key stays where the CA was made (keep it offline); no host holds it, nor the
//! controller's key.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, string::Ia5String,
};
use sopa_channel::{
    identity::{Identity, IdentityError, Role},
    tls::{CA, CONTROLLER_NAME, NODE},
};

/// The CA's private key, beside `ca.pem` in the CA's folder.
pub const CA_KEY: &str = "ca.key";

#[derive(Debug, thiserror::Error)]
pub enum CertError {
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
    #[error("{path}: not a usable CA ({message}); make one with `sopactl certs init DIR`")]
    BadCa { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    BadCertificate { path: PathBuf, message: String },
    #[error("generating certificates: {0}")]
    Generate(#[from] rcgen::Error),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error("--name {0:?}: only a controller's certificate carries DNS names or addresses")]
    NamesNotForRole(String),
    #[error("--days {0}: a certificate must be valid for 1 to 3650 days")]
    Days(u32),
    #[error("--days {0}: the CA must be valid for 1 to 36500 days (100 years)")]
    CaDays(u32),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CertError + '_ {
    move |source| CertError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Days a CA is valid for by default: ten years (every certificate it issues must expire before
/// it does; renew the CA, and reissue under it, before then).
pub const CA_DAYS: u32 = 3650;

/// Makes a new CA in `dir`, valid for `days` from now; refuses to overwrite one.
pub fn init(dir: &Path, days: u32) -> Result<Vec<PathBuf>, CertError> {
    if !(1..=36_500).contains(&days) {
        return Err(CertError::CaDays(days));
    }
    for n in [CA, CA_KEY] {
        let p = dir.join(n);
        if p.exists() {
            return Err(CertError::Exists(p));
        }
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.distinguished_name = name("SOPA fabric CA");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let at = |secs: i64| {
        time::OffsetDateTime::from_unix_timestamp(secs).expect("a time within two centuries")
    };
    params.not_before = at(now - 300);
    params.not_after = at(now + 86_400 * i64::from(days));
    let key = KeyPair::generate()?;
    let key_pem = key.serialize_pem();
    let ca = CertifiedIssuer::self_signed(params, key)?;
    let mut written = Vec::new();
    for (n, contents, secret) in [(CA, ca.pem(), false), (CA_KEY, key_pem, true)] {
        let path = dir.join(n);
        write_new(&path, contents.as_bytes(), secret)?;
        written.push(path);
    }
    Ok(written)
}

/// What a certificate is issued with.
#[derive(Clone, Debug)]
pub struct IssueOptions {
    /// DNS names and addresses a controller's certificate is valid for.
    pub names: Vec<String>,
    /// Days of validity from now.
    pub days: u32,
    /// Issue an already-expired certificate (for tests of the refusal).
    pub expired: bool,
}

impl Default for IssueOptions {
    fn default() -> Self {
        Self {
            names: Vec::new(),
            days: 365,
            expired: false,
        }
    }
}

/// A certificate just issued.
#[derive(Clone, Debug)]
pub struct Issued {
    pub files: Vec<PathBuf>,
    /// Its serial number, as a deny list names it (lowercase hex).
    pub serial: String,
}

/// Issues `identity` a certificate of the CA in `ca_dir`, written to `out` (`ca.pem`,
/// `node.pem`, `node.key`); refuses to overwrite. A controller's certificate is a server
/// certificate valid for `opts.names` (by default `sopa-controller`, `localhost` and
/// `127.0.0.1`); every other role's is a client certificate.
pub fn issue(
    ca_dir: &Path,
    identity: &Identity,
    out: &Path,
    opts: &IssueOptions,
) -> Result<Issued, CertError> {
    if !(1..=3650).contains(&opts.days) {
        return Err(CertError::Days(opts.days));
    }
    let server = identity.role == Role::Controller;
    if !server && let Some(n) = opts.names.first() {
        return Err(CertError::NamesNotForRole(n.clone()));
    }
    for n in [CA, NODE.0, NODE.1] {
        let p = out.join(n);
        if p.exists() {
            return Err(CertError::Exists(p));
        }
    }
    let ca_path = ca_dir.join(CA);
    let ca_pem = std::fs::read_to_string(&ca_path).map_err(io(&ca_path))?;
    let key_path = ca_dir.join(CA_KEY);
    let key_pem = std::fs::read_to_string(&key_path).map_err(io(&key_path))?;
    let bad_ca = |path: &Path, e: rcgen::Error| CertError::BadCa {
        path: path.to_owned(),
        message: e.to_string(),
    };
    let ca_key = KeyPair::from_pem(&key_pem).map_err(|e| bad_ca(&key_path, e))?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).map_err(|e| bad_ca(&ca_path, e))?;

    let mut names = opts.names.clone();
    if server && names.is_empty() {
        names = vec![
            CONTROLLER_NAME.into(),
            "localhost".into(),
            "127.0.0.1".into(),
        ];
    }
    let mut params = CertificateParams::new(names)?;
    params
        .subject_alt_names
        .push(SanType::URI(Ia5String::try_from(identity.uri())?));
    params.distinguished_name = name(&identity.to_string());
    params.extended_key_usages = vec![if server {
        ExtendedKeyUsagePurpose::ServerAuth
    } else {
        ExtendedKeyUsagePurpose::ClientAuth
    }];
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    if opts.expired {
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
    } else {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let at = |secs: i64| {
            time::OffsetDateTime::from_unix_timestamp(secs).expect("a time within the 21st century")
        };
        // Five minutes of slack for clocks that are a little behind.
        params.not_before = at(now - 300);
        params.not_after = at(now + 86_400 * i64::from(opts.days));
    }
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    let serial = serial_hex(
        x509_parser::parse_x509_certificate(cert.der())
            .map_err(|e| CertError::BadCa {
                path: ca_path.clone(),
                message: format!("the issued certificate does not parse: {e}"),
            })?
            .1
            .tbs_certificate
            .raw_serial(),
    );
    std::fs::create_dir_all(out).map_err(io(out))?;
    let mut files = Vec::new();
    for (n, contents, secret) in [
        (CA, ca_pem, false),
        (NODE.0, cert.pem(), false),
        (NODE.1, key.serialize_pem(), true),
    ] {
        let path = out.join(n);
        write_new(&path, contents.as_bytes(), secret)?;
        files.push(path);
    }
    Ok(Issued { files, serial })
}

/// The identity and serial of a certificate file (PEM), as the controller reads them.
pub fn read_identity(path: &Path) -> Result<(Identity, String), CertError> {
    let pem = std::fs::read(path).map_err(io(path))?;
    let bad = |message: String| CertError::BadCertificate {
        path: path.to_owned(),
        message,
    };
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(&pem).map_err(|e| bad(format!("not PEM: {e}")))?;
    crate::auth::certificate_identity(&pem.contents).map_err(bad)
}

/// A serial number as deny lists name it: lowercase hex, no separators or leading zeros.
pub use sopa_channel::identity::serial_hex;

fn write_new(path: &Path, bytes: &[u8], secret: bool) -> Result<(), CertError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(path)
        .map_err(io(path))?;
    std::io::Write::write_all(&mut f, bytes).map_err(io(path))
}

fn name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn.push(DnType::OrganizationName, "SOPA");
    dn
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cas_validity_is_what_was_asked_for() {
        let dir = std::env::temp_dir().join(format!("sopa-ca-days-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(matches!(init(&dir, 0), Err(CertError::CaDays(0))));
        init(&dir, 400).unwrap();
        let pem = std::fs::read(dir.join(CA)).unwrap();
        let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
        let cert = pem.parse_x509().unwrap();
        let days = (cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp())
            / 86_400;
        assert_eq!(days, 400, "valid from five minutes ago for 400 days");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
