//! TLS material for tests: a CA made on the spot (rcgen, no tool needed),
//! the certificates it signs, and the file layouts that read them: the
//! server's `--tls-cert`/`--tls-key` files and libnbd's
//! `tls-certificates=` client directory.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A certificate authority and the directory its files go to.
pub struct Pki {
    ca_cert: rcgen::Certificate,
    ca_key: KeyPair,
    dir: PathBuf,
}

impl Pki {
    /// A new CA (common name `<name> test CA`) whose files go to
    /// `dir/name` (created).
    pub fn new(dir: &Path, name: &str) -> Pki {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = p.self_signed(&ca_key).unwrap();
        Pki {
            ca_cert,
            ca_key,
            dir,
        }
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.ca_cert.pem()
    }

    /// The CA certificate, DER (e.g. for a rustls root store).
    pub fn ca_der(&self) -> Vec<u8> {
        self.ca_cert.der().to_vec()
    }

    fn issue(&self, sans: &[&str], usage: ExtendedKeyUsagePurpose) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut p =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        p.distinguished_name.push(DnType::CommonName, sans[0]);
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![usage];
        let cert = p.signed_by(&key, &self.ca_cert, &self.ca_key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// A new server certificate for `localhost` and `127.0.0.1` signed by
    /// this CA: (certificate PEM, key PEM).
    pub fn server_pem(&self) -> (String, String) {
        self.issue(
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// [`Pki::server_pem`] written to `server-cert.pem` and
    /// `server-key.pem` (mode 0600) in this CA's directory: the paths for
    /// `serve --tls-cert` and `--tls-key`.
    pub fn server_files(&self) -> (PathBuf, PathBuf) {
        let (cert, key) = self.server_pem();
        let (cert_path, key_path) = (
            self.dir.join("server-cert.pem"),
            self.dir.join("server-key.pem"),
        );
        std::fs::write(&cert_path, cert).unwrap();
        std::fs::write(&key_path, key).unwrap();
        std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
        (cert_path, key_path)
    }

    /// A libnbd certificates directory (`tls-certificates=`), `name` in this
    /// CA's directory, trusting this CA (`ca-cert.pem`), with a client
    /// certificate signed by `client_ca` (`client-cert.pem`,
    /// `client-key.pem`) if given.
    pub fn client_dir(&self, name: &str, client_ca: Option<&Pki>) -> PathBuf {
        let d = self.dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("ca-cert.pem"), self.ca_pem()).unwrap();
        if let Some(c) = client_ca {
            let (cert, key) = c.issue(&["client"], ExtendedKeyUsagePurpose::ClientAuth);
            std::fs::write(d.join("client-cert.pem"), cert).unwrap();
            std::fs::write(d.join("client-key.pem"), key).unwrap();
        }
        d
    }
}
