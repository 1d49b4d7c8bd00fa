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
