//! The README's table of FABRICOLL_* variables matches the one in src/config/vars.rs.
use nccl_net_fabricoll::config::VARS;

#[test]
fn readme_table_matches_config() {
    let readme = include_str!("../README.md");
    let rows: Vec<Vec<String>> = readme
        .lines()
        .filter(|l| l.starts_with("| `FABRICOLL_"))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().trim_matches('`').to_string())
                .collect()
        })
        .collect();
    let names: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    for v in VARS {
        let row = rows
            .iter()
            .find(|r| r[0] == v.name)
            .unwrap_or_else(|| panic!("README lacks {}", v.name));
        assert_eq!(row.len(), 4, "{}: row needs 4 columns", v.name);
        assert_eq!(row[1], v.accepted, "{}: accepted values differ", v.name);
        assert_eq!(row[2], v.default, "{}: default differs", v.name);
        assert_eq!(row[3], v.meaning, "{}: meaning differs", v.name);
    }
    for n in names {
        assert!(
            VARS.iter().any(|v| v.name == n),
            "README documents {n}, which config.rs does not read"
        );
    }
    // Every FABRICOLL_ variable the library's and tools' sources name in a string (where they
    // read it) is in the table; the C API's FABRICOLL_ constants are identifiers, and the test
    // suite's own switches (src/testing.rs) are not configuration.
    let mut files = Vec::new();
    sources(
        std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src")),
        &mut files,
    );
    assert!(files.len() > 20, "found only {} source files", files.len());
    for path in files.iter().filter(|p| !p.ends_with("testing.rs")) {
        let src = std::fs::read_to_string(path).unwrap();
        for part in src.split("\"FABRICOLL_").skip(1) {
            let name: String = part
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || *c == '_' || c.is_ascii_digit())
                .collect();
            if !name.is_empty() && !name.ends_with('_') {
                let full = format!("FABRICOLL_{name}");
                assert!(
                    VARS.iter().any(|v| v.name == full),
                    "{full} is used in {} but not in the table",
                    path.display()
                );
            }
        }
    }
}

/// Every `.rs` file under `dir`.
fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}
