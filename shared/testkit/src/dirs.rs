//! Temporary directories that remove themselves when dropped, also when a test panics.

pub use tempfile::TempDir;

/// A fresh directory in the system's temporary directory, named after `name` (a prefix
/// `kvd-test-NAME-` and a random part), removed with everything in it when dropped.
pub fn temp_dir(name: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(&format!("kvd-test-{name}-"))
        .tempdir()
        .unwrap_or_else(|e| panic!("cannot make a temporary directory for {name}: {e}"))
}

/// A path in a fresh temporary directory (the directory itself, or a file in it), removed
/// with the directory when dropped; used as a `Path`.
pub struct Scratch {
    _dir: TempDir,
    path: std::path::PathBuf,
}

/// A fresh temporary directory named after `name`, as a [`Scratch`].
pub fn scratch(name: &str) -> Scratch {
    let dir = temp_dir(name);
    let path = dir.path().to_path_buf();
    Scratch { _dir: dir, path }
}

/// The file `file` (not created) in a fresh temporary directory named after `name`.
pub fn scratch_file(name: &str, file: &str) -> Scratch {
    let dir = temp_dir(name);
    let path = dir.path().join(file);
    Scratch { _dir: dir, path }
}

impl std::ops::Deref for Scratch {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.path
    }
}

impl AsRef<std::path::Path> for Scratch {
    fn as_ref(&self) -> &std::path::Path {
        &self.path
    }
}
