//! Finding the CUDA libraries (driver, NVRTC, cuBLAS) before cudarc opens them.
//!
//! cudarc (features `dynamic-loading` and `cuda-13000`) opens each library by *file name*
//! through the system loader, trying an unversioned `libX.so` first and then, among others,
//! `libcuda.so.1`, `libnvrtc.so.13`, `libnvrtc.so.12`, `libcublas.so.13`, `libcublas.so.12`.
//! The loader looks only in `LD_LIBRARY_PATH` (as it was when the process started), its cache
//! and the system folders, so it misses a CUDA toolkit that is not registered with it and the
//! libraries that Python's `nvidia-*` wheels unpack into `site-packages/nvidia/*/lib`.
//!
//! [`prepare`] searches those places itself ([`SearchDirs`], in the order listed there), picks
//! the newest supported major version in the first folder that has one ([`find`]) — never newer
//! than the driver's CUDA version, when the driver is known — and opens that file by its full
//! path, with its companions (`libcublasLt` for cuBLAS) first. The handle stays open for the
//! life of the process. When cudarc later asks the loader for `libnvrtc.so.13`, the loader
//! answers with the library already loaded under that soname. When nothing is found, cudarc
//! still tries its own names on the loader path, and the error names every folder searched
//! ([`not_found_message`]). One case escapes the choice: cudarc tries the unversioned `libX.so`
//! first, so a toolkit's development link (`/usr/local/cuda/lib64/libnvrtc.so`) on the loader's
//! path is used in preference; [`loaded_files`] shows which files a run really used.
//!
//! Environment variables read:
//!
//! | variable | meaning |
//! |---|---|
//! | `KDA_CUDA_LIB_DIR` | folders (`:`-separated) searched before anything else |
//! | `LD_LIBRARY_PATH` | the loader's own path |
//! | `CUDA_HOME`, `CUDA_PATH`, `CUDA_ROOT`, `CUDA_TOOLKIT_ROOT_DIR` | toolkit roots (`lib64`, `lib`, `targets/x86_64-linux/lib`) |
//! | `KDA_CUDA_PYTHON_SITE` | `site-packages` folders (`:`-separated) whose `nvidia/*/lib` are searched |
//! | `VIRTUAL_ENV`, `CONDA_PREFIX` | Python environments (`lib/python3*/site-packages/nvidia/*/lib`) |
//! | `HOME` | `~/.local/lib/python3*/site-packages/nvidia/*/lib` |

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The CUDA major versions whose NVRTC and cuBLAS this crate loads, newest first.
pub const SUPPORTED_MAJORS: [u32; 2] = [13, 12];

/// One of the CUDA libraries this crate opens at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CudaLibrary {
    /// The driver, `libcuda.so.1` (installed with the NVIDIA driver, not with the toolkit).
    Driver,
    /// The run-time compiler, `libnvrtc.so.{13,12}`.
    Nvrtc,
    /// cuBLAS, `libcublas.so.{13,12}` (with `libcublasLt` of the same version).
    Cublas,
}

impl CudaLibrary {
    /// Every library, in the order they are first used.
    pub const ALL: [CudaLibrary; 3] =
        [CudaLibrary::Driver, CudaLibrary::Nvrtc, CudaLibrary::Cublas];

    /// The file-name stem (`libnvrtc`).
    pub fn stem(self) -> &'static str {
        match self {
            CudaLibrary::Driver => "libcuda",
            CudaLibrary::Nvrtc => "libnvrtc",
            CudaLibrary::Cublas => "libcublas",
        }
    }

    /// File names accepted, most preferred first, with their CUDA major version (0 for the
    /// driver, whose soname carries no CUDA version). `max_major` drops newer majors.
    pub fn candidates(self, max_major: Option<u32>) -> Vec<(String, u32)> {
        match self {
            CudaLibrary::Driver => vec![("libcuda.so.1".to_owned(), 0)],
            _ => SUPPORTED_MAJORS
                .iter()
                .filter(|&&m| max_major.is_none_or(|max| m <= max))
                .map(|&m| (format!("{}.so.{m}", self.stem()), m))
                .collect(),
        }
    }

    /// Files beside `found` that must be loaded before it, because the library asks the loader
    /// for them by name and the loader would look only on its own path: `libcublasLt.so.N`
    /// (a `DT_NEEDED` of cuBLAS) and NVRTC's `libnvrtc-builtins.so.N.M` (opened by NVRTC at
    /// its first compile; the CUDA 13.0 wheel's NVRTC has no `$ORIGIN` run path to find it).
    pub fn companions(self, found: &Found) -> Vec<PathBuf> {
        let Some(dir) = found.path.parent() else {
            return Vec::new();
        };
        match self {
            CudaLibrary::Driver => Vec::new(),
            CudaLibrary::Cublas => {
                let lt = dir.join(format!("libcublasLt.so.{}", found.major));
                if lt.is_file() {
                    vec![lt]
                } else {
                    Vec::new()
                }
            }
            CudaLibrary::Nvrtc => {
                let prefix = format!("libnvrtc-builtins.so.{}.", found.major);
                let Ok(entries) = std::fs::read_dir(dir) else {
                    return Vec::new();
                };
                let mut v: Vec<PathBuf> = entries
                    .filter_map(|e| e.ok())
                    .filter(|e| {
                        e.file_name()
                            .to_str()
                            .is_some_and(|n| n.starts_with(&prefix))
                    })
                    .map(|e| e.path())
                    .filter(|p| p.is_file())
                    .collect();
                v.sort();
                v
            }
        }
    }

    fn index(self) -> usize {
        match self {
            CudaLibrary::Driver => 0,
            CudaLibrary::Nvrtc => 1,
            CudaLibrary::Cublas => 2,
        }
    }
}

/// A library file chosen by [`find`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Full path of the file.
    pub path: PathBuf,
    /// Its CUDA major version (0 for the driver).
    pub major: u32,
}

/// Fixed system folders, relative to the file-system root.
const SYSTEM_DIRS: [&str; 7] = [
    "usr/local/cuda/lib64",
    "usr/local/cuda/targets/x86_64-linux/lib",
    "usr/local/nvidia/lib64",
    "usr/local/nvidia/lib",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib64",
    "usr/lib/wsl/lib",
];

/// Toolkit-root variables and the library folders under each.
const TOOLKIT_VARS: [&str; 4] = [
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_ROOT",
    "CUDA_TOOLKIT_ROOT_DIR",
];
const TOOLKIT_SUBDIRS: [&str; 3] = ["lib64", "lib", "targets/x86_64-linux/lib"];

/// The folders searched for the CUDA libraries, in priority order, without duplicates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchDirs {
    /// Existing folders, first searched first.
    pub dirs: Vec<PathBuf>,
}

impl SearchDirs {
    /// The folders for this process's environment.
    pub fn from_env() -> SearchDirs {
        SearchDirs::from_vars(|name| std::env::var_os(name), Path::new("/"))
    }

    /// The folders for the variables `var` returns, with the fixed system folders taken under
    /// `root` (`/` in real use; a fake tree in tests). Order:
    /// 1. `KDA_CUDA_LIB_DIR`; 2. `LD_LIBRARY_PATH`; 3. toolkit roots (`CUDA_HOME`, ...);
    /// 4. Python environments named by `KDA_CUDA_PYTHON_SITE`, `VIRTUAL_ENV`, `CONDA_PREFIX`;
    /// 5. system folders (`/usr/local/cuda/lib64`, the driver's `/usr/local/nvidia/lib64`, ...);
    /// 6. system and user Python environments (`/usr/local/lib/python3*/dist-packages`, ...).
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>, root: &Path) -> SearchDirs {
        let list = |name: &str| -> Vec<PathBuf> {
            var(name)
                .map(|v| std::env::split_paths(&v).collect())
                .unwrap_or_default()
        };
        let mut dirs = Vec::new();
        dirs.extend(list("KDA_CUDA_LIB_DIR"));
        dirs.extend(list("LD_LIBRARY_PATH"));
        for name in TOOLKIT_VARS {
            for home in list(name) {
                dirs.extend(TOOLKIT_SUBDIRS.iter().map(|s| home.join(s)));
            }
        }
        let mut sites = list("KDA_CUDA_PYTHON_SITE");
        for name in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
            for prefix in list(name) {
                sites.extend(python_sites(&prefix.join("lib"), "site-packages"));
            }
        }
        dirs.extend(sites.iter().flat_map(|s| wheel_lib_dirs(s)));
        dirs.extend(SYSTEM_DIRS.iter().map(|d| root.join(d)));
        let mut system_sites = Vec::new();
        for lib in ["usr/local/lib", "usr/lib"] {
            for kind in ["dist-packages", "site-packages"] {
                system_sites.extend(python_sites(&root.join(lib), kind));
            }
        }
        system_sites.push(root.join("usr/lib/python3/dist-packages"));
        if let Some(home) = var("HOME") {
            let local = PathBuf::from(home).join(".local/lib");
            system_sites.extend(python_sites(&local, "site-packages"));
        }
        dirs.extend(system_sites.iter().flat_map(|s| wheel_lib_dirs(s)));
        let mut seen = std::collections::HashSet::new();
        dirs.retain(|d| !d.as_os_str().is_empty() && d.is_dir() && seen.insert(d.clone()));
        SearchDirs { dirs }
    }
}

/// Sorted subfolders of `dir` whose names pass `keep`; nothing when `dir` cannot be read.
fn subdirs(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_str().is_some_and(&keep))
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    out.sort();
    out
}

/// `lib/python3*/<kind>` folders under `lib`, newest Python first.
fn python_sites(lib: &Path, kind: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = subdirs(lib, |n| n.starts_with("python3"))
        .into_iter()
        .map(|p| p.join(kind))
        .collect();
    v.reverse();
    v
}

/// The `nvidia/*/lib` folders of one `site-packages` folder (`nvidia/cu13/lib` for the CUDA 13
/// wheels, `nvidia/cuda_nvrtc/lib` and `nvidia/cublas/lib` for the CUDA 12 ones).
pub fn wheel_lib_dirs(site: &Path) -> Vec<PathBuf> {
    subdirs(&site.join("nvidia"), |_| true)
        .into_iter()
        .map(|p| p.join("lib"))
        .filter(|p| p.is_dir())
        .collect()
}

/// The first folder of `dirs` holding an accepted file name of `lib`, and in it the newest
/// major version not above `max_major`.
pub fn find(lib: CudaLibrary, dirs: &[PathBuf], max_major: Option<u32>) -> Option<Found> {
    let names = lib.candidates(max_major);
    dirs.iter().find_map(|dir| {
        names.iter().find_map(|(name, major)| {
            let path = dir.join(name);
            path.is_file().then_some(Found {
                path,
                major: *major,
            })
        })
    })
}

/// What [`prepare`] did for one library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepared {
    /// This file (and its companions) is loaded; cudarc will get it by soname.
    Loaded(Found),
    /// No folder holds it; cudarc's own names on the loader path are all that is left.
    NotFound,
    /// The file was found but could not be opened (wrong architecture, missing dependency, ...).
    Failed {
        /// The file.
        path: PathBuf,
        /// The loader's message.
        error: String,
    },
}

/// Finds `lib` (see the module documentation) and opens it by full path, once per process;
/// later calls return the first outcome. `max_major` caps the CUDA version (the driver's).
pub fn prepare(lib: CudaLibrary, max_major: Option<u32>) -> Prepared {
    static SLOTS: [OnceLock<Prepared>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    SLOTS[lib.index()]
        .get_or_init(|| {
            let dirs = SearchDirs::from_env();
            match find(lib, &dirs.dirs, max_major) {
                None => Prepared::NotFound,
                Some(found) => match open_with_companions(lib, &found) {
                    Ok(()) => Prepared::Loaded(found),
                    Err(error) => Prepared::Failed {
                        path: found.path,
                        error,
                    },
                },
            }
        })
        .clone()
}

/// Opens the companions found beside `found`, then `found`, and keeps them open for good.
fn open_with_companions(lib: CudaLibrary, found: &Found) -> Result<(), String> {
    for path in lib.companions(found) {
        open_global(&path)?;
    }
    open_global(&found.path)
}

/// `dlopen(path, RTLD_NOW | RTLD_GLOBAL)`, never closed.
pub fn open_global(path: &Path) -> Result<(), String> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: loading runs the library's initialisers. The files opened here are the CUDA
    // libraries (or, in tests, a system library) that cudarc would open and call anyway; they
    // are never unloaded (the handle is forgotten), so no termination routine runs early.
    let lib = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }
        .map_err(|e| format!("{}: {e}", path.display()))?;
    std::mem::forget(lib);
    Ok(())
}

/// The error text for a library that could not be loaded: the names tried, every folder
/// searched, and how to point the crate at the right one.
pub fn not_found_message(lib: CudaLibrary, max_major: Option<u32>, dirs: &SearchDirs) -> String {
    let names: Vec<String> = lib
        .candidates(max_major)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let folders = if dirs.dirs.is_empty() {
        "none of them exists".to_owned()
    } else {
        dirs.dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let hint = match lib {
        CudaLibrary::Driver => "is the NVIDIA driver installed? set KDA_CUDA_LIB_DIR to the folder holding libcuda.so.1",
        CudaLibrary::Nvrtc => "install the `nvidia-cuda-nvrtc` wheel (CUDA 13) or `nvidia-cuda-nvrtc-cu12`, or a CUDA toolkit, or set KDA_CUDA_LIB_DIR to the folder holding it",
        CudaLibrary::Cublas => "install the `nvidia-cublas` wheel (CUDA 13) or `nvidia-cublas-cu12`, or a CUDA toolkit, or set KDA_CUDA_LIB_DIR to the folder holding it",
    };
    format!(
        "{} could not be loaded: searched KDA_CUDA_LIB_DIR, LD_LIBRARY_PATH, CUDA_HOME/CUDA_PATH, \
         Python environments (KDA_CUDA_PYTHON_SITE, VIRTUAL_ENV, CONDA_PREFIX, system and user \
         site-packages: nvidia/*/lib) and system folders [{folders}], then the loader's default \
         path; {hint}",
        names.join(" / ")
    )
}

/// The error text when `lib` is still unusable after [`prepare`]: a file that was found but
/// would not open, then [`not_found_message`].
pub(crate) fn unavailable_message(lib: CudaLibrary, max_major: Option<u32>) -> String {
    let base = not_found_message(lib, max_major, &SearchDirs::from_env());
    match prepare(lib, max_major) {
        Prepared::Failed { path, error } => format!(
            "{} was found but could not be opened ({error}); {base}",
            path.display()
        ),
        _ => base,
    }
}

/// The CUDA library files mapped into this process (from `/proc/self/maps`): which driver,
/// NVRTC and cuBLAS a run actually used. Empty when none is loaded or the file is unreadable.
pub fn loaded_files() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/maps")
        .map(|maps| cuda_files_in_maps(&maps))
        .unwrap_or_default()
}

/// The distinct CUDA library paths in a `/proc/<pid>/maps` text, in order of appearance.
fn cuda_files_in_maps(maps: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        let path = PathBuf::from(path);
        let is_cuda = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
            ["libcuda.so", "libnvrtc", "libcublas"]
                .iter()
                .any(|p| n.starts_with(p))
        });
        if is_cuda && !out.contains(&path) {
            out.push(path);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A scratch folder removed on drop.
    struct Tree(PathBuf);

    impl Tree {
        fn new() -> Tree {
            static N: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "kda-cuda-libs-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("scratch dir");
            Tree(dir)
        }
        /// Creates an empty file at `rel` (and its folders); returns its path.
        fn file(&self, rel: &str) -> PathBuf {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, b"").expect("write");
            p
        }
        fn path(&self, rel: &str) -> PathBuf {
            self.0.join(rel)
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn vars(pairs: &[(&str, PathBuf)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone().into_os_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn dirs_for(t: &Tree, pairs: &[(&str, PathBuf)]) -> Vec<PathBuf> {
        SearchDirs::from_vars(vars(pairs), &t.path("root")).dirs
    }

    #[test]
    fn cu13_wheel_layout_is_found_through_a_python_site() {
        let t = Tree::new();
        let nvrtc = t.file("venv/lib/python3.12/site-packages/nvidia/cu13/lib/libnvrtc.so.13");
        let blas = t.file("venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublas.so.13");
        let dirs = dirs_for(&t, &[("VIRTUAL_ENV", t.path("venv"))]);
        let f = find(CudaLibrary::Nvrtc, &dirs, None).expect("nvrtc found");
        assert_eq!((f.path, f.major), (nvrtc, 13));
        assert_eq!(
            find(CudaLibrary::Cublas, &dirs, None).map(|f| f.path),
            Some(blas)
        );
        // The same site named directly.
        let site = t.path("venv/lib/python3.12/site-packages");
        let dirs = dirs_for(&t, &[("KDA_CUDA_PYTHON_SITE", site)]);
        assert!(find(CudaLibrary::Nvrtc, &dirs, None).is_some());
    }

    #[test]
    fn cu12_wheel_layout_is_found_per_package_folder() {
        let t = Tree::new();
        let site = "root/usr/local/lib/python3.11/dist-packages";
        let nvrtc = t.file(&format!("{site}/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"));
        let blas = t.file(&format!("{site}/nvidia/cublas/lib/libcublas.so.12"));
        let dirs = dirs_for(&t, &[]);
        assert_eq!(
            find(CudaLibrary::Nvrtc, &dirs, None).map(|f| f.path),
            Some(nvrtc)
        );
        let f = find(CudaLibrary::Cublas, &dirs, None).expect("cublas found");
        assert_eq!((f.path, f.major), (blas, 12));
    }

    #[test]
    fn newest_major_wins_inside_a_folder_unless_the_driver_is_older() {
        let t = Tree::new();
        t.file("cuda/lib64/libnvrtc.so.12");
        let n13 = t.file("cuda/lib64/libnvrtc.so.13");
        let dirs = dirs_for(&t, &[("CUDA_HOME", t.path("cuda"))]);
        assert_eq!(
            find(CudaLibrary::Nvrtc, &dirs, None).map(|f| f.path),
            Some(n13)
        );
        let f = find(CudaLibrary::Nvrtc, &dirs, Some(12)).expect("12 allowed");
        assert_eq!(f.major, 12);
        assert_eq!(find(CudaLibrary::Nvrtc, &dirs, Some(11)), None);
    }

    #[test]
    fn override_comes_first_and_the_system_folders_last() {
        let t = Tree::new();
        t.file("root/usr/local/cuda/lib64/libnvrtc.so.13");
        t.file("ld/libnvrtc.so.13");
        let mine = t.file("mine/libnvrtc.so.12");
        let dirs = dirs_for(
            &t,
            &[
                ("KDA_CUDA_LIB_DIR", t.path("mine")),
                ("LD_LIBRARY_PATH", t.path("ld")),
            ],
        );
        assert_eq!(dirs[0], t.path("mine"));
        assert_eq!(dirs[1], t.path("ld"));
        assert_eq!(dirs.last(), Some(&t.path("root/usr/local/cuda/lib64")));
        assert_eq!(
            find(CudaLibrary::Nvrtc, &dirs, None).map(|f| f.path),
            Some(mine)
        );
    }

    #[test]
    fn colon_lists_duplicates_and_missing_folders() {
        let t = Tree::new();
        t.file("a/x");
        t.file("b/x");
        let list = std::env::join_paths([t.path("a"), t.path("nope"), t.path("b"), t.path("a")])
            .expect("join");
        let dirs = SearchDirs::from_vars(
            |k| (k == "LD_LIBRARY_PATH").then(|| list.clone()),
            &t.path("root"),
        )
        .dirs;
        assert_eq!(dirs, vec![t.path("a"), t.path("b")]);
    }

    #[test]
    fn driver_is_found_in_the_driver_mount() {
        let t = Tree::new();
        let cuda = t.file("root/usr/local/nvidia/lib64/libcuda.so.1");
        let dirs = dirs_for(&t, &[]);
        let f = find(CudaLibrary::Driver, &dirs, Some(12)).expect("driver");
        assert_eq!((f.path, f.major), (cuda, 0));
        assert_eq!(find(CudaLibrary::Nvrtc, &dirs, None), None);
    }

    #[test]
    fn home_local_site_is_searched() {
        let t = Tree::new();
        let p = t.file("home/.local/lib/python3.12/site-packages/nvidia/cu13/lib/libcublas.so.13");
        let dirs = dirs_for(&t, &[("HOME", t.path("home"))]);
        assert_eq!(
            find(CudaLibrary::Cublas, &dirs, None).map(|f| f.path),
            Some(p)
        );
    }

    #[test]
    fn not_found_message_names_files_and_folders() {
        let t = Tree::new();
        t.file("empty/readme");
        let dirs =
            SearchDirs::from_vars(vars(&[("KDA_CUDA_LIB_DIR", t.path("empty"))]), &t.path("r"));
        let m = not_found_message(CudaLibrary::Nvrtc, None, &dirs);
        assert!(m.contains("libnvrtc.so.13 / libnvrtc.so.12"), "{m}");
        assert!(m.contains(&t.path("empty").display().to_string()), "{m}");
        assert!(m.contains("KDA_CUDA_LIB_DIR"), "{m}");
        let none = SearchDirs { dirs: Vec::new() };
        let m = not_found_message(CudaLibrary::Cublas, Some(12), &none);
        assert!(m.starts_with("libcublas.so.12 could not"), "{m}");
        assert!(m.contains("none of them exists"), "{m}");
    }

    #[test]
    fn companions_are_the_builtins_and_cublaslt_of_the_same_version() {
        let t = Tree::new();
        let nvrtc = t.file("lib/libnvrtc.so.13");
        let builtins = t.file("lib/libnvrtc-builtins.so.13.0");
        t.file("lib/libnvrtc-builtins.alt.so.13.0");
        t.file("lib/libnvrtc-builtins.so.12.8");
        let blas = t.file("lib/libcublas.so.13");
        let lt = t.file("lib/libcublasLt.so.13");
        t.file("lib/libcublasLt.so.12");
        let found = |path: PathBuf| Found { path, major: 13 };
        assert_eq!(CudaLibrary::Nvrtc.companions(&found(nvrtc)), vec![builtins]);
        assert_eq!(CudaLibrary::Cublas.companions(&found(blas)), vec![lt]);
        let alone = t.file("other/libcublas.so.13");
        assert!(CudaLibrary::Cublas.companions(&found(alone)).is_empty());
    }

    #[test]
    fn maps_parsing_keeps_cuda_libraries_once() {
        let maps = "\
7f00-7f01 r--p 00000000 08:01 1 /opt/v/nvidia/cu13/lib/libnvrtc.so.13
7f01-7f02 r-xp 00001000 08:01 1 /opt/v/nvidia/cu13/lib/libnvrtc.so.13
7f02-7f03 r--p 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6
7f03-7f04 r--p 00000000 08:01 3 /usr/local/nvidia/lib64/libcuda.so.580.1
7f04-7f05 rw-p 00000000 00:00 0
7f05-7f06 r--p 00000000 08:01 4 /x/libcublasLt.so.13
";
        assert_eq!(
            cuda_files_in_maps(maps),
            vec![
                PathBuf::from("/opt/v/nvidia/cu13/lib/libnvrtc.so.13"),
                PathBuf::from("/usr/local/nvidia/lib64/libcuda.so.580.1"),
                PathBuf::from("/x/libcublasLt.so.13"),
            ]
        );
    }

    #[test]
    fn open_global_loads_a_real_library_and_reports_a_bad_file() {
        // A library every glibc system has, found with the same search (system folders).
        let dirs = SearchDirs::from_env().dirs;
        if let Some(libm) = dirs
            .iter()
            .map(|d| d.join("libm.so.6"))
            .find(|p| p.is_file())
        {
            assert_eq!(open_global(&libm), Ok(()));
        }
        let t = Tree::new();
        let bad = t.file("libnvrtc.so.13"); // empty: not an ELF file
        let err = open_global(&bad).expect_err("an empty file is no library");
        assert!(err.contains("libnvrtc.so.13"), "{err}");
    }
}
