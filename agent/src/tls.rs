//! The one TLS client configuration every outgoing https connection uses: the Pyroscope
//! and OTLP sinks, the OTLP metrics push and the debuginfod client. Which CAs are trusted
//! (a configured PEM file, else the system's roots), which crypto provider (ring, as it
//! needs no C toolchain) and which protocol versions (rustls' safe defaults) are decided
//! here once, so no client can drift to a weaker or different trust.
//!
//! A leaf: it imports nothing of the crate, so a stage of any rank may use it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, TrustAnchor};
use rustls::{ClientConfig, RootCertStore};

/// Why no TLS configuration could be made from a CA file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The CA file could not be opened or read.
    #[error("reading CA file {}", path.display())]
    ReadCa {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The CA file holds something that is not a PEM certificate.
    #[error("parsing CA file {}", path.display())]
    ParseCa {
        /// The file.
        path: PathBuf,
        /// Why.
        source: pem::Error,
    },
    /// rustls refused a certificate of the CA file.
    #[error("CA file {}", path.display())]
    AddCa {
        /// The file.
        path: PathBuf,
        /// Why.
        source: rustls::Error,
    },
    /// The CA file holds no certificate.
    #[error("CA file {} holds no certificate", path.display())]
    NoCa {
        /// The file.
        path: PathBuf,
    },
    /// rustls could not be configured.
    #[error("TLS setup")]
    Setup(#[source] rustls::Error),
}

/// The CAs to trust: every PEM certificate in `ca_file`, or the system's roots when it is
/// empty (the path `""`, i.e. not configured).
pub fn trusted(ca_file: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    if ca_file.as_os_str().is_empty() {
        for cert in rustls_native_certs::load_native_certs().certs {
            // One unusable system certificate must not disable TLS altogether.
            let _ = roots.add(cert);
        }
        if roots.is_empty() {
            tracing::warn!(
                "no system CA certificates found; https clients will fail (set ca_file)"
            );
        }
        return Ok(roots);
    }
    let path = || ca_file.to_owned();
    let pem = read_capped(ca_file).map_err(|source| TlsError::ReadCa {
        path: path(),
        source,
    })?;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|source| TlsError::ParseCa {
            path: path(),
            source,
        })?;
        roots.add(cert).map_err(|source| TlsError::AddCa {
            path: path(),
            source,
        })?;
    }
    if roots.is_empty() {
        return Err(TlsError::NoCa { path: path() });
    }
    Ok(roots)
}

/// Most bytes of a CA file read: a bundle of every public CA is about 200 KiB.
const MAX_CA_FILE: u64 = 16 << 20;

/// The file's bytes; one larger than [`MAX_CA_FILE`] is refused, not read whole.
fn read_capped(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_CA_FILE + 1)
        .read_to_end(&mut out)?;
    if out.len() as u64 > MAX_CA_FILE {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_CA_FILE} bytes"),
        ));
    }
    Ok(out)
}

/// The client configuration trusting `roots`: ring, rustls' safe protocol versions, no
/// client certificate. An empty store trusts nothing (for connectors that need a
/// configuration even for plain http).
pub fn client(roots: RootCertStore) -> Result<ClientConfig, TlsError> {
    Ok(
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Setup)?
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// [`client`] of [`trusted`]`(ca_file)`.
pub fn client_for(ca_file: &Path) -> Result<ClientConfig, TlsError> {
    client(trusted(ca_file)?)
}

/// The trust anchors of [`trusted`]`(ca_file)`, for gRPC clients (tonic) that take anchors
/// rather than a rustls configuration; they pair them with the same ring provider.
pub fn anchors(ca_file: &Path) -> Result<Vec<TrustAnchor<'static>>, TlsError> {
    Ok(trusted(ca_file)?.roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_must_hold_a_certificate() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "no certificate here\n").expect("write");
        let err = client_for(&ca).map(|_| ()).map_err(|e| e.to_string());
        assert_eq!(
            err,
            Err(format!("CA file {} holds no certificate", ca.display()))
        );
        let missing = Path::new("/nonexistent/ember-ca.pem");
        let err = anchors(missing).map(|_| ()).map_err(|e| e.to_string());
        assert_eq!(err, Err("reading CA file /nonexistent/ember-ca.pem".into()));
    }
}
