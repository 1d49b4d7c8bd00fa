//! Every `kvd`, `kvbench` and `kvtui` command line the README and docs/ show in code blocks
//! parses with the tools' own command-line definitions: a renamed or removed flag, or a
//! value the tool would refuse, fails here rather than in a reader's terminal.

use std::path::{Path, PathBuf};

use clap::Parser;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The command lines in fenced code blocks of `text`: a leading `$ ` and a trailing
/// `# comment` or `&` are dropped; lines with shell syntax this test cannot split (pipes,
/// quotes, variables, `;`, `&&`, `\` continuations), synopses and screen captures are left
/// out.
fn commands(text: &str) -> Vec<String> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            inside = !inside;
            continue;
        }
        if !inside {
            continue;
        }
        let line = line.trim().trim_start_matches("$ ");
        let line = line.split("  #").next().unwrap_or("").trim();
        let line = line.strip_suffix(" &").unwrap_or(line).trim();
        let tool = line.split_whitespace().next().unwrap_or("");
        if !["kvd", "kvbench", "kvtui"].contains(&tool) {
            continue;
        }
        // Synopses (`[--flag X]`) and screen captures are not command lines.
        let synopsis_or_capture = line.contains('[') || !line.is_ascii();
        if synopsis_or_capture
            || line.contains(['|', '"', '\'', '$', ';', '\\', '<', '>', '`'])
            || line.contains("&&")
            || line.contains("...")
        {
            continue;
        }
        out.push(line.to_string());
    }
    out
}

fn parses(line: &str) -> Result<(), String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let result = match words[0] {
        "kvd" => kvd::cli::Cli::try_parse_from(&words).map(drop),
        "kvbench" => kvbench::cli::Cli::try_parse_from(&words).map(drop),
        _ => kvtui::cli::Cli::try_parse_from(&words).map(drop),
    };
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn every_documented_command_line_parses() {
    let mut files = vec![repo_root().join("README.md")];
    for entry in std::fs::read_dir(repo_root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    let mut checked = 0;
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for line in commands(&text) {
            checked += 1;
            if let Err(e) = parses(&line) {
                failures.push(format!("{}: `{line}`:\n{e}", file.display()));
            }
        }
    }
    assert!(
        checked >= 20,
        "only {checked} command lines found: is the extraction broken?"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The documents of the repository that state flags and defaults.
fn documents() -> Vec<(PathBuf, String)> {
    let mut files = vec![repo_root().join("README.md")];
    for entry in std::fs::read_dir(repo_root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            (f, text)
        })
        .collect()
}

/// Every default value clap knows for a long flag, over all three tools and their
/// subcommands: `("snapshot-every", "64mib")`.
fn flag_defaults() -> Vec<(String, String)> {
    use clap::CommandFactory;
    fn walk(cmd: &clap::Command, out: &mut Vec<(String, String)>) {
        for arg in cmd.get_arguments() {
            if let Some(long) = arg.get_long() {
                for d in arg.get_default_values() {
                    out.push((long.to_string(), d.to_string_lossy().into_owned()));
                }
            }
        }
        cmd.get_subcommands().for_each(|s| walk(s, out));
    }
    let mut out = Vec::new();
    walk(&kvd::cli::Cli::command(), &mut out);
    walk(&kvbench::cli::Cli::command(), &mut out);
    walk(&kvtui::cli::Cli::command(), &mut out);
    out
}

/// "`--flag` (default `value`" or "`--flag` (default value)" in prose: (flag, value).
fn stated_defaults(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("` (default ") {
        let Some(open) = text[..at].rfind("`--") else { continue };
        let flag = &text[open + 3..at];
        if flag.contains([' ', '`']) {
            continue;
        }
        let rest = &text[at + "` (default ".len()..];
        let value: String = rest
            .trim_start_matches('`')
            .chars()
            .take_while(|c| !matches!(c, '`' | ')' | ',' | ';' | ' '))
            .collect();
        out.push((flag.to_string(), value));
    }
    out
}

#[test]
fn documented_defaults_are_the_tools_defaults() {
    let known = flag_defaults();
    let mut checked = 0;
    let mut failures = Vec::new();
    for (file, text) in documents() {
        for (flag, value) in stated_defaults(&text) {
            checked += 1;
            let code: Vec<&String> = known.iter().filter(|(f, _)| *f == flag).map(|(_, v)| v).collect();
            if !code.contains(&&value) {
                failures.push(format!(
                    "{}: `--{flag}` is documented with default {value}; the tools' defaults: {code:?}",
                    file.display()
                ));
            }
        }
    }
    assert!(
        checked >= 2,
        "only {checked} stated defaults found: is the extraction broken?"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_documented_histogram_buckets_are_the_exposed_ones() {
    let (_, http) = documents()
        .into_iter()
        .find(|(f, _)| f.ends_with("docs/HTTP.md"))
        .unwrap();
    let first_ns = kvshared::latency::upper_ns(0);
    let stated = format!("one bucket per doubling from {first_ns} ns");
    assert!(
        http.contains(&stated),
        "docs/HTTP.md should say \"{stated}\" (the first `le` kvd exposes)"
    );
}

#[test]
fn the_stated_default_extraction_reads_both_spellings() {
    let text = "past `--snapshot-every` (default `64mib`, or more); `--timeout` (default 5s) bounds";
    assert_eq!(
        stated_defaults(text),
        vec![
            ("snapshot-every".into(), "64mib".into()),
            ("timeout".into(), "5s".into())
        ]
    );
}

/// Every `#[ignore]`d test of the workspace is in the README's table of tests that need
/// root, with its file, and the table lists no test that is not ignored: the list of what
/// a plain `cargo test` leaves out stays true.
#[test]
fn every_ignored_test_is_listed_in_the_readme() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let mut ignored = Vec::new();
    for crate_dir in ["kvd", "kvbench", "kvtui", "shared"] {
        let mut todo = vec![repo_root().join(crate_dir)];
        while let Some(dir) = todo.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().filter_map(Result::ok) {
                let path = entry.path();
                if path.is_dir() {
                    todo.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    let mut lines = text.lines();
                    while let Some(line) = lines.next() {
                        if !line.trim_start().starts_with("#[ignore") {
                            continue;
                        }
                        let name = lines
                            .by_ref()
                            .find_map(|l| l.trim().strip_prefix("fn ").or(l.trim().strip_prefix("async fn ")))
                            .and_then(|l| l.split('(').next())
                            .unwrap_or_default()
                            .to_string();
                        let file = path.strip_prefix(repo_root()).unwrap().display().to_string();
                        ignored.push((file, name));
                    }
                }
            }
        }
    }
    for (file, name) in &ignored {
        assert!(
            readme.contains(&format!("| `{file}` `{name}` |")),
            "{file}: {name} is ignored but not in the README's table"
        );
    }
    let listed = readme
        .lines()
        .filter(|l| l.trim_start().starts_with("| `") && l.contains(".rs` `"))
        .count();
    assert_eq!(
        listed,
        ignored.len(),
        "the README lists {listed} ignored tests, the code has {ignored:?}"
    );
}
