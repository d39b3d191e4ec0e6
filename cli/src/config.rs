//! The credentials store: the API key `login` obtained and its account's email, in
//! `$XDG_CONFIG_HOME/postmesh/credentials.json` (else `$HOME/.config/postmesh/...`), a file
//! only its owner can read, replaced whole on each write.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context as _};
use serde::{Deserialize, Serialize};

/// The directory under the config directory, and the file in it.
const DIR_NAME: &str = "postmesh";
const FILE_NAME: &str = "credentials.json";

/// What `login` stores.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Credentials {
    /// The key itself.
    pub api_key: String,
    /// The account's email address.
    pub email: String,
    /// The API that issued the key; the key is only sent there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_url: Option<String>,
}

/// The credentials file of this user.
#[derive(Debug)]
pub struct CredentialsStore {
    path: PathBuf,
}

impl CredentialsStore {
    /// The store in the user's config directory, as the environment names it.
    pub fn locate() -> anyhow::Result<Self> {
        Self::in_config_dir(
            std::env::var_os("XDG_CONFIG_HOME"),
            std::env::var_os("HOME"),
        )
    }

    /// The store under `xdg_config_home` when that is an absolute path (the XDG rule), else
    /// under `home/.config`.
    fn in_config_dir(
        xdg_config_home: Option<OsString>, home: Option<OsString>,
    ) -> anyhow::Result<Self> {
        let xdg = xdg_config_home
            .map(PathBuf::from)
            .filter(|p| p.is_absolute());
        let home = home
            .filter(|h| !h.is_empty())
            .map(|h| PathBuf::from(h).join(".config"));
        let dir = xdg.or(home).ok_or_else(|| {
            anyhow!("cannot find a config directory: set HOME or XDG_CONFIG_HOME")
        })?;
        Ok(Self {
            path: dir.join(DIR_NAME).join(FILE_NAME),
        })
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The stored credentials; `None` when there is no file.
    pub fn load(&self) -> anyhow::Result<Option<Credentials>> {
        let text = match fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(e).with_context(|| format!("cannot read {}", self.path.display()))
            }
        };
        let credentials = serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is damaged; run postmesh logout, then postmesh login",
                self.path.display()
            )
        })?;
        Ok(Some(credentials))
    }

    /// Stores `credentials`: written to a new owner-only file beside the old one, then
    /// renamed over it, so a reader sees the old file or the new one, never a part.
    pub fn save(&self, credentials: &Credentials) -> anyhow::Result<()> {
        let context = || format!("cannot write {}", self.path.display());
        let dir = self
            .path
            .parent()
            .ok_or_else(|| anyhow!("{} has no directory", self.path.display()))?;
        create_private_dir(dir).with_context(context)?;
        let mut text = serde_json::to_vec_pretty(credentials).with_context(context)?;
        text.push(b'\n');
        let nonce = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let temp = dir.join(format!(".{FILE_NAME}.{}.{nonce}.tmp", std::process::id()));
        let written = write_private(&temp, &text).and_then(|()| fs::rename(&temp, &self.path));
        if written.is_err() {
            // The temp file may exist (written, not renamed); it holds the key, so it goes.
            let _ = fs::remove_file(&temp);
        }
        written.with_context(context)
    }

    /// Deletes the file; whether there was one.
    pub fn remove(&self) -> anyhow::Result<bool> {
        match fs::remove_file(&self.path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e).with_context(|| format!("cannot delete {}", self.path.display())),
        }
    }
}

/// Creates `dir` and its parents; on Unix a directory made here is its owner's alone.
fn create_private_dir(dir: &Path) -> io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Writes `bytes` to the new file `path`, created readable and writable by its owner alone
/// (mode 0600 from the start, not changed after), and flushes it to disk.
fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_in(dir: &Path) -> CredentialsStore {
        CredentialsStore::in_config_dir(Some(dir.as_os_str().to_owned()), None).unwrap()
    }

    #[test]
    fn credentials_are_saved_owner_only_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_in(dir.path());
        assert_eq!(store.load().unwrap(), None);
        let credentials = Credentials {
            api_key: "pm_0123abcd_secret".into(),
            email: "ann@example.com".into(),
            api_url: Some("http://127.0.0.1:8080".into()),
        };
        store.save(&credentials).unwrap();
        assert_eq!(store.path(), dir.path().join("postmesh/credentials.json"));
        assert_eq!(store.load().unwrap(), Some(credentials.clone()));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(store.path()).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "file mode {mode:o}");
            let dir_mode = fs::metadata(dir.path().join("postmesh"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(dir_mode & 0o777, 0o700, "dir mode {dir_mode:o}");
        }
        // A second login replaces the file whole and leaves no temp file behind.
        let again = Credentials {
            api_key: "pm_4567cdef_other".into(),
            ..credentials
        };
        store.save(&again).unwrap();
        assert_eq!(store.load().unwrap(), Some(again));
        let names: Vec<_> = fs::read_dir(dir.path().join("postmesh"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["credentials.json"]);
        assert!(store.remove().unwrap());
        assert!(!store.remove().unwrap());
        assert_eq!(store.load().unwrap(), None);
    }

    #[test]
    fn a_damaged_file_says_how_to_recover() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_in(dir.path());
        fs::create_dir_all(dir.path().join("postmesh")).unwrap();
        fs::write(store.path(), "{not json").unwrap();
        let err = format!("{:#}", store.load().unwrap_err());
        assert!(err.contains("is damaged; run postmesh logout"), "{err}");
    }

    #[test]
    fn the_config_dir_follows_xdg_then_home() {
        let path = |xdg: Option<&str>, home: Option<&str>| {
            CredentialsStore::in_config_dir(xdg.map(Into::into), home.map(Into::into))
                .map(|s| s.path().to_owned())
        };
        assert_eq!(
            path(Some("/x/cfg"), Some("/home/ann")).unwrap(),
            Path::new("/x/cfg/postmesh/credentials.json")
        );
        // A relative XDG_CONFIG_HOME is ignored, as the XDG rule says.
        assert_eq!(
            path(Some("cfg"), Some("/home/ann")).unwrap(),
            Path::new("/home/ann/.config/postmesh/credentials.json")
        );
        assert!(path(None, None).is_err());
        assert!(path(Some(""), Some("")).is_err());
    }
}
