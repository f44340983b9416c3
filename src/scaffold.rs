//! `payhook new`: a merchant service crate rendered from `templates/merchant/` — handlers
//! with working defaults, a commented `payhook.toml`, a scenario, and an integration test
//! that starts the service and runs the scenario against it.
//!
//! The templates are plain files with `{{placeholders}}`; `templates/merchant/manifest.toml`
//! says where each lands. They are compiled in, so the binary scaffolds anywhere.
//!
//! ```no_run
//! use payhook::scaffold::{Dependency, Options, StoreKind, render};
//!
//! let written = render(&Options {
//!     name: "shop".into(),
//!     dir: "shop".into(),
//!     force: false,
//!     payhook: Dependency::Version("0.1".into()),
//!     store: StoreKind::Sled,
//! })?;
//! println!("{} files written", written.len());
//! # Ok::<(), payhook::scaffold::ScaffoldError>(())
//! ```

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The template files, by name.
const TEMPLATES: [(&str, &str); 8] = [
    (
        "Cargo.toml.tmpl",
        include_str!("../templates/merchant/Cargo.toml.tmpl"),
    ),
    (
        "gitignore.tmpl",
        include_str!("../templates/merchant/gitignore.tmpl"),
    ),
    (
        "README.md.tmpl",
        include_str!("../templates/merchant/README.md.tmpl"),
    ),
    (
        "payhook.toml.tmpl",
        include_str!("../templates/merchant/payhook.toml.tmpl"),
    ),
    (
        "lib.rs.tmpl",
        include_str!("../templates/merchant/lib.rs.tmpl"),
    ),
    (
        "main.rs.tmpl",
        include_str!("../templates/merchant/main.rs.tmpl"),
    ),
    (
        "scenario.toml.tmpl",
        include_str!("../templates/merchant/scenario.toml.tmpl"),
    ),
    (
        "scenario_test.rs.tmpl",
        include_str!("../templates/merchant/scenario_test.rs.tmpl"),
    ),
];

/// Where each template lands.
const MANIFEST: &str = include_str!("../templates/merchant/manifest.toml");

/// Names Rust or cargo reserve, refused as crate names: the standard crates, Rust's
/// keywords (the crate's code names itself, `shop::app`: `type::app` would not compile), and
/// the crates the scaffold depends on (a package cannot depend on its own name).
const RESERVED: &[&str] = &[
    "payhook",
    "test",
    "core",
    "std",
    "alloc",
    "proc_macro",
    "build",
    // The scaffold's dependencies.
    "rust_decimal",
    "serde_json",
    "tokio",
    "tracing",
    "tracing_subscriber",
    "tempfile",
    // Rust's keywords, strict and reserved.
    "as",
    "async",
    "await",
    "break",
    "const",
    "continue",
    "crate",
    "dyn",
    "else",
    "enum",
    "extern",
    "false",
    "fn",
    "for",
    "if",
    "impl",
    "in",
    "let",
    "loop",
    "match",
    "mod",
    "move",
    "mut",
    "pub",
    "ref",
    "return",
    "self",
    "static",
    "struct",
    "super",
    "trait",
    "true",
    "type",
    "unsafe",
    "use",
    "where",
    "while",
    "abstract",
    "become",
    "box",
    "do",
    "final",
    "gen",
    "macro",
    "override",
    "priv",
    "try",
    "typeof",
    "unsized",
    "virtual",
    "yield",
];

/// Why a crate could not be scaffolded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScaffoldError {
    /// The name cannot be a crate's.
    #[error(
        "`{name}` is not a valid crate name: {why} (use letters, digits, `-` and `_`, starting with a letter)"
    )]
    BadName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The directory exists and is not empty.
    #[error("{0} exists and is not empty; choose another --path, or pass --force to write into it")]
    NotEmpty(PathBuf),
    /// Writing failed.
    #[error("cannot write {path}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The compiled-in templates are inconsistent (a bug in payhook).
    #[error("templates: {0}")]
    Templates(String),
}

/// Where the new crate gets payhook from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dependency {
    /// A version from the registry.
    Version(String),
    /// A local checkout (its `Cargo.lock` is copied too, so the crate builds with the same
    /// dependency versions, offline).
    Path(PathBuf),
}

impl Dependency {
    /// The dependency as an inline TOML table, with `extra` keys (e.g. `features = [...]`).
    fn toml(&self, extra: &str) -> String {
        let source = match self {
            Self::Version(version) => format!("version = {}", toml::Value::String(version.clone())),
            Self::Path(path) => {
                format!("path = {}", toml::Value::String(path.display().to_string()))
            }
        };
        if extra.is_empty() {
            format!("{{ {source} }}")
        } else {
            format!("{{ {source}, {extra} }}")
        }
    }
}

/// Where the new service keeps its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum StoreKind {
    /// The embedded sled store: one instance, nothing else to run.
    #[default]
    Sled,
    /// sled, or PostgreSQL when `store.url` is set (payhook's `postgres` feature): the
    /// service may run as several instances, and its test runs on PostgreSQL when
    /// `PAYHOOK_TEST_DATABASE_URL` is set.
    Postgres,
}

/// What to scaffold.
#[derive(Debug, Clone)]
pub struct Options {
    /// The crate's name.
    pub name: String,
    /// Its directory.
    pub dir: PathBuf,
    /// Write into a non-empty directory (existing files are overwritten).
    pub force: bool,
    /// Where payhook comes from.
    pub payhook: Dependency,
    /// Where the service keeps its records.
    pub store: StoreKind,
}

#[derive(Debug, Deserialize)]
struct Manifest {
    file: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
struct Entry {
    template: String,
    to: String,
}

/// Checks that `name` can be a crate's name.
///
/// # Errors
///
/// [`ScaffoldError::BadName`] saying why not.
pub fn check_name(name: &str) -> Result<(), ScaffoldError> {
    let bad = |why| {
        Err(ScaffoldError::BadName {
            name: name.to_owned(),
            why,
        })
    };
    let Some(first) = name.chars().next() else {
        return bad("it is empty");
    };
    if !first.is_ascii_alphabetic() {
        return bad("it must start with a letter");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return bad("it may hold only ASCII letters, digits, `-` and `_`");
    }
    if name.len() > 64 {
        return bad("it is longer than 64 characters");
    }
    if RESERVED.contains(&name.replace('-', "_").to_ascii_lowercase().as_str()) {
        return bad("it is reserved");
    }
    Ok(())
}

/// Renders the templates into `options.dir`; returns the files written.
///
/// # Errors
///
/// [`ScaffoldError`] for a bad name, a non-empty directory without `force`, or a failed write.
pub fn render(options: &Options) -> Result<Vec<PathBuf>, ScaffoldError> {
    check_name(&options.name)?;
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| ScaffoldError::Io { path, source }
    };
    if !options.force
        && std::fs::read_dir(&options.dir).is_ok_and(|mut entries| entries.next().is_some())
    {
        return Err(ScaffoldError::NotEmpty(options.dir.clone()));
    }
    let manifest: Manifest =
        toml::from_str(MANIFEST).map_err(|e| ScaffoldError::Templates(e.to_string()))?;
    let values = [
        ("{{name}}", options.name.clone()),
        ("{{crate}}", options.name.replace('-', "_")),
        (
            "{{payhook_dependency}}",
            options.payhook.toml(match options.store {
                StoreKind::Sled => "",
                StoreKind::Postgres => r#"features = ["postgres"]"#,
            }),
        ),
        (
            "{{payhook_dev_dependency}}",
            options.payhook.toml(match options.store {
                StoreKind::Sled => r#"features = ["sim"]"#,
                StoreKind::Postgres => r#"features = ["sim", "postgres"]"#,
            }),
        ),
        (
            "{{store_url}}",
            match options.store {
                StoreKind::Sled => "# url = \"postgres://payhook@db/payments\"  # PostgreSQL: needs payhook's `postgres` feature".to_owned(),
                StoreKind::Postgres => "# url = \"postgres://payhook@db/payments?sslmode=verify-full\"  # or PAYHOOK_STORE_URL; unset: sled".to_owned(),
            },
        ),
    ];
    let mut written = Vec::new();
    for entry in &manifest.file {
        let template = TEMPLATES
            .iter()
            .find(|(name, _)| *name == entry.template)
            .map(|(_, text)| *text)
            .ok_or_else(|| ScaffoldError::Templates(format!("{} is missing", entry.template)))?;
        let mut text = template.to_owned();
        for (placeholder, value) in &values {
            text = text.replace(placeholder, value);
        }
        if let Some(at) = text.find("{{") {
            let rest: String = text[at..].chars().take(30).collect();
            return Err(ScaffoldError::Templates(format!(
                "{}: unknown placeholder at `{rest}`",
                entry.template
            )));
        }
        let path = options.dir.join(&entry.to);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&path, text).map_err(io(&path))?;
        written.push(path);
    }
    if let Dependency::Path(checkout) = &options.payhook {
        let lock = checkout.join("Cargo.lock");
        if lock.exists() {
            let to = options.dir.join("Cargo.lock");
            std::fs::copy(&lock, &to).map_err(io(&to))?;
            written.push(to);
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for good in ["shop", "my-shop", "shop_2"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in [
            "", "2shop", "my shop", "shöp", "payhook", "test", "self", "a/b",
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_template_is_in_the_manifest_and_every_entry_has_a_template() {
        let manifest: Manifest = toml::from_str(MANIFEST).unwrap();
        let listed: Vec<&str> = manifest.file.iter().map(|e| e.template.as_str()).collect();
        let embedded: Vec<&str> = TEMPLATES.iter().map(|(name, _)| *name).collect();
        let mut a = listed.clone();
        let mut b = embedded.clone();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
        let on_disk = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/templates/merchant"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n != "manifest.toml")
            .count();
        assert_eq!(
            on_disk,
            embedded.len(),
            "a template file is not compiled in"
        );
    }

    #[test]
    fn rendering_fills_every_placeholder_and_refuses_a_non_empty_directory() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options {
            name: "my-shop".into(),
            dir: dir.path().join("my-shop"),
            force: false,
            payhook: Dependency::Version("0.1".into()),
            store: StoreKind::Sled,
        };
        let written = render(&options).unwrap();
        assert_eq!(written.len(), 8);
        let cargo = std::fs::read_to_string(options.dir.join("Cargo.toml")).unwrap();
        let manifest: toml::Table = toml::from_str(&cargo).unwrap();
        assert_eq!(manifest["package"]["name"].as_str(), Some("my-shop"));
        // The service depends on the library alone; its tests add the simulator.
        let library = &manifest["dependencies"]["payhook"];
        assert_eq!(library.get("version").and_then(|v| v.as_str()), Some("0.1"));
        assert!(library.get("features").is_none());
        let tests = &manifest["dev-dependencies"]["payhook"];
        assert_eq!(tests.get("version").and_then(|v| v.as_str()), Some("0.1"));
        assert_eq!(tests["features"].to_string(), r#"["sim"]"#);
        let main = std::fs::read_to_string(options.dir.join("src/main.rs")).unwrap();
        assert!(main.contains("my_shop::app("));
        assert!(matches!(render(&options), Err(ScaffoldError::NotEmpty(_))));
        assert!(
            render(&Options {
                force: true,
                ..options.clone()
            })
            .is_ok()
        );
        // The PostgreSQL variant: the same code, the feature on both dependencies.
        render(&Options {
            force: true,
            store: StoreKind::Postgres,
            ..options.clone()
        })
        .unwrap();
        let cargo = std::fs::read_to_string(options.dir.join("Cargo.toml")).unwrap();
        let manifest: toml::Table = toml::from_str(&cargo).unwrap();
        let library = &manifest["dependencies"]["payhook"];
        assert_eq!(library["features"].to_string(), r#"["postgres"]"#);
        let tests = &manifest["dev-dependencies"]["payhook"];
        assert_eq!(tests["features"].to_string(), r#"["sim", "postgres"]"#);
    }
}
