//! Config files: the example loads; every invalid fixture fails with its stated message, in-process
//! and through the binary (exit status 2, one line on stderr).

use std::path::{Path, PathBuf};
use std::process::Command;

use tollgate::Config;

use crate::support::tollgate::binary;

fn fixtures() -> Vec<(PathBuf, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/invalid");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("fixtures dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).expect("read fixture");
            let expect = text
                .lines()
                .next()
                .and_then(|l| l.strip_prefix("# expect: "))
                .unwrap_or_else(|| panic!("{} must start with '# expect: '", path.display()))
                .to_string();
            out.push((path, expect));
        }
    }
    out.sort();
    assert!(
        out.len() >= 10,
        "expected the fixture corpus, found {}",
        out.len()
    );
    out
}

#[test]
fn the_example_config_loads_and_resolves_its_buckets() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/example.toml");
    let config = Config::load(&path).expect("example config is valid");
    let keys: Vec<String> = config.buckets.iter().map(|b| b.key()).collect();
    assert_eq!(
        keys,
        [
            "tollgate:{geo}",
            "tollgate:{geo:eu}",
            "tollgate:{geo:us}",
            "tollgate:{nominatim}"
        ]
    );
}

#[test]
fn every_invalid_fixture_names_file_key_and_problem() {
    for (path, expect) in fixtures() {
        let err = Config::load(&path)
            .expect_err("fixture must be invalid")
            .to_string();
        assert!(
            err.contains(&expect),
            "{}:\n  got: {err}\n want: {expect}",
            path.display()
        );
        assert!(
            err.starts_with(&path.display().to_string()),
            "names the file: {err}"
        );
    }
}

#[test]
fn check_exits_2_with_one_line_for_each_invalid_fixture() {
    for (path, expect) in fixtures() {
        let out = Command::new(binary())
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .expect("run tollgate check");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {stderr}", path.display());
        assert!(stderr.contains(&expect), "{}: {stderr}", path.display());
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn check_prints_the_resolved_buckets_and_exits_0() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/example.toml");
    let out = Command::new(binary())
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .expect("run tollgate check");
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for want in [
        "KEY",
        "UPSTREAM",
        "RATE",
        "CAPACITY",
        "tollgate:{geo:eu}",
        "https://eu.api.geo.example",
        "20/s",
        "60",
    ] {
        assert!(stdout.contains(want), "missing {want:?} in:\n{stdout}");
    }
}

#[test]
fn environment_overrides_reach_the_binary_and_secrets_stay_hidden() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/example.toml");
    let out = Command::new(binary())
        .args(["check", "--config"])
        .arg(&path)
        .env("TOLLGATE__STORE__BACKEND", "redis")
        .env(
            "TOLLGATE__STORE__URL",
            "redis://app:hunter2@127.0.0.1:6390/0",
        )
        .env("TOLLGATE__PROVIDERS__NOMINATIM__RATE", "2.5")
        .output()
        .expect("run tollgate check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("redis redis://app:***@127.0.0.1:6390/0"),
        "{stdout}"
    );
    assert!(!stdout.contains("hunter2"));
    assert!(stdout.contains("2.5/s"), "{stdout}");
}
