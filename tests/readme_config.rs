//! The README's table of FABRICOLL_* variables matches the one in src/config.rs.
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
    // Every FABRICOLL_ variable named anywhere in the sources is in the table.
    for src in [
        include_str!("../src/config.rs"),
        include_str!("../src/plugin/mod.rs"),
        include_str!("../src/plugin/net.rs"),
    ] {
        for part in src.split("FABRICOLL_").skip(1) {
            let name: String = part
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || *c == '_' || c.is_ascii_digit())
                .collect();
            if !name.is_empty() {
                let full = format!("FABRICOLL_{name}");
                assert!(
                    VARS.iter().any(|v| v.name == full),
                    "{full} is used but not in the table"
                );
            }
        }
    }
}
