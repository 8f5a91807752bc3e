//! The two text formats locksmithd's settings live in, read as systemd reads them:
//! `EnvironmentFile=` files (`/etc/flatcar/update.conf`: `KEY=value` lines, `#`/`;` comments,
//! single or double quotes, a trailing backslash continues the line) and the `Environment=` and
//! `EnvironmentFile=` lines of a unit file and its drop-ins.

/// One `KEY=value` assignment and the line it came from (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub key: String,
    pub value: String,
    pub line: usize,
}

/// A line that could not be read, with why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine {
    pub line: usize,
    pub text: String,
    pub why: LineError,
}

/// Why a line of an environment file or an `Environment=` line is not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    #[error("not KEY=value")]
    NotAssignment,
    #[error("{0:?} is not a variable name")]
    NotVariableName(String),
    /// A backslash is the last character of the value (or of the `Environment=` line).
    #[error("a backslash ends the {0}")]
    BackslashAtEnd(&'static str),
    #[error("text after the closing quote: {0:?}")]
    TextAfterQuote(String),
    #[error("the {0} quote is not closed")]
    QuoteNotClosed(&'static str),
}

/// Physical lines joined where one ends in a backslash; each with the number of its first line.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let (start, mut acc) = current.take().unwrap_or((i + 1, String::new()));
        match raw.strip_suffix('\\') {
            Some(head) => {
                acc.push_str(head);
                current = Some((start, acc));
            }
            None => {
                acc.push_str(raw);
                out.push((start, acc));
            }
        }
    }
    if let Some(last) = current {
        out.push(last);
    }
    out
}

fn is_comment_or_blank(line: &str) -> bool {
    let t = line.trim_start();
    t.is_empty() || t.starts_with('#') || t.starts_with(';')
}

fn valid_key(key: &str) -> bool {
    let mut chars = key.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Unquote a value as systemd's environment file reader does: `"..."` with backslash escapes,
/// `'...'` verbatim, otherwise the text with surrounding blanks removed.
fn unquote(raw: &str) -> Result<String, LineError> {
    let v = raw.trim();
    if let Some(rest) = v.strip_prefix('"') {
        let mut out = String::new();
        let mut chars = rest.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some(n) => out.push(n),
                    None => return Err(LineError::BackslashAtEnd("value")),
                },
                '"' => {
                    let tail: String = chars.collect();
                    if !tail.trim().is_empty() && !tail.trim_start().starts_with('#') {
                        return Err(LineError::TextAfterQuote(tail));
                    }
                    return Ok(out);
                }
                c => out.push(c),
            }
        }
        return Err(LineError::QuoteNotClosed("double"));
    }
    if let Some(rest) = v.strip_prefix('\'') {
        return match rest.find('\'') {
            Some(end) => Ok(rest[..end].to_string()),
            None => Err(LineError::QuoteNotClosed("single")),
        };
    }
    Ok(v.to_string())
}

/// Read an environment file: its assignments in order and the lines that are not one.
pub fn parse_env_file(text: &str) -> (Vec<Assignment>, Vec<BadLine>) {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for (line, l) in logical_lines(text) {
        if is_comment_or_blank(&l) {
            continue;
        }
        let Some((k, v)) = l.split_once('=') else {
            bad.push(BadLine {
                line,
                text: l.clone(),
                why: LineError::NotAssignment,
            });
            continue;
        };
        let key = k.trim();
        if !valid_key(key) {
            bad.push(BadLine {
                line,
                text: l.clone(),
                why: LineError::NotVariableName(key.to_string()),
            });
            continue;
        }
        match unquote(v) {
            Ok(value) => good.push(Assignment {
                key: key.to_string(),
                value,
                line,
            }),
            Err(why) => bad.push(BadLine {
                line,
                text: l.clone(),
                why,
            }),
        }
    }
    (good, bad)
}

/// Split the value of an `Environment=` line into its words, honouring quotes:
/// `"A=1 2" B=3` is two assignments.
fn split_words(value: &str) -> Result<Vec<String>, LineError> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '"' | '\'' => {
                in_word = true;
                let quote = c;
                loop {
                    match chars.next() {
                        Some('\\') if quote == '"' => match chars.next() {
                            Some(n) => word.push(n),
                            None => return Err(LineError::BackslashAtEnd("line")),
                        },
                        Some(q) if q == quote => break,
                        Some(other) => word.push(other),
                        None => {
                            return Err(LineError::QuoteNotClosed(if quote == '"' {
                                "\""
                            } else {
                                "'"
                            }))
                        }
                    }
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

/// What a unit file or drop-in says about the environment of its `[Service]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitEnvironment {
    /// `Environment=` assignments in order; `None` marks an empty `Environment=`, which
    /// clears the ones before it.
    pub environment: Vec<Option<Assignment>>,
    /// `EnvironmentFile=` paths in order (`optional` for a leading `-`); `None` marks an empty
    /// `EnvironmentFile=`, which clears the list.
    pub files: Vec<Option<(String, bool)>>,
    pub bad: Vec<BadLine>,
}

/// Read the `[Service]` environment settings of a unit file or drop-in.
pub fn parse_unit(text: &str) -> UnitEnvironment {
    let mut out = UnitEnvironment::default();
    let mut section = String::new();
    for (line, l) in logical_lines(text) {
        if is_comment_or_blank(&l) {
            continue;
        }
        let t = l.trim();
        if t.starts_with('[') && t.ends_with(']') {
            section = t[1..t.len() - 1].to_string();
            continue;
        }
        if section != "Service" {
            continue;
        }
        let Some((k, v)) = t.split_once('=') else {
            continue;
        };
        match k.trim() {
            "Environment" => {
                let v = v.trim();
                if v.is_empty() {
                    out.environment.push(None);
                    continue;
                }
                match split_words(v) {
                    Ok(words) => {
                        for w in words {
                            match w.split_once('=') {
                                Some((key, value)) if valid_key(key) => {
                                    out.environment.push(Some(Assignment {
                                        key: key.to_string(),
                                        value: value.to_string(),
                                        line,
                                    }))
                                }
                                _ => out.bad.push(BadLine {
                                    line,
                                    text: w.clone(),
                                    why: LineError::NotAssignment,
                                }),
                            }
                        }
                    }
                    Err(why) => out.bad.push(BadLine {
                        line,
                        text: l.clone(),
                        why,
                    }),
                }
            }
            "EnvironmentFile" => {
                let v = v.trim();
                if v.is_empty() {
                    out.files.push(None);
                } else if let Some(p) = v.strip_prefix('-') {
                    out.files.push(Some((p.to_string(), true)));
                } else {
                    out.files.push(Some((v.to_string(), false)));
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(a: &[Assignment]) -> Vec<(&str, &str)> {
        a.iter()
            .map(|a| (a.key.as_str(), a.value.as_str()))
            .collect()
    }

    #[test]
    fn env_file_reads_quotes_comments_and_continuations() {
        let text = "# update.conf\nGROUP=stable\n; other comment\nREBOOT_STRATEGY=\"etcd-lock\"\n\
                    LOCKSMITHD_REBOOT_WINDOW_START='Thu 23:00'\n  SPACED = value with blanks  \n\
                    LONG=a\\\nb\nESC=\"a\\\"b\"\n";
        let (good, bad) = parse_env_file(text);
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(
            kv(&good),
            [
                ("GROUP", "stable"),
                ("REBOOT_STRATEGY", "etcd-lock"),
                ("LOCKSMITHD_REBOOT_WINDOW_START", "Thu 23:00"),
                ("SPACED", "value with blanks"),
                ("LONG", "ab"),
                ("ESC", "a\"b"),
            ]
        );
        assert_eq!(good[1].line, 4);
    }

    #[test]
    fn env_file_names_bad_lines() {
        let (good, bad) = parse_env_file("OK=1\njust words\n9X=2\nQ=\"open\n");
        assert_eq!(kv(&good), [("OK", "1")]);
        let lines: Vec<_> = bad.iter().map(|b| b.line).collect();
        assert_eq!(lines, [2, 3, 4]);
        assert!(
            bad[2].why.to_string().contains("not closed"),
            "{:?}",
            bad[2]
        );
    }

    #[test]
    fn unit_environment_words_resets_and_files() {
        let text = "[Unit]\nEnvironment=IGNORED=1\n[Service]\nEnvironment=\"A=1 2\" B=3\n\
                    Environment=\nEnvironment=C=4\nEnvironmentFile=-/etc/flatcar/update.conf\n\
                    EnvironmentFile=/etc/other.conf\n";
        let u = parse_unit(text);
        assert!(u.bad.is_empty(), "{:?}", u.bad);
        let env: Vec<_> = u
            .environment
            .iter()
            .map(|a| a.as_ref().map(|a| (a.key.as_str(), a.value.as_str())))
            .collect();
        assert_eq!(
            env,
            [Some(("A", "1 2")), Some(("B", "3")), None, Some(("C", "4"))]
        );
        assert_eq!(
            u.files,
            [
                Some(("/etc/flatcar/update.conf".into(), true)),
                Some(("/etc/other.conf".into(), false))
            ]
        );
    }
}
