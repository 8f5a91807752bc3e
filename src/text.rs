//! Text from outside rebootd (a store, an API server, a remote service, a command's output) made
//! safe to show: cut to a bound, with control characters and bidirectional overrides escaped,
//! before it reaches the journal, the state file, `rebootctl status` or its `--json`. A value
//! any node can write must not be able to move the operator's cursor, recolour the terminal or
//! fill the disk.

/// The most characters of one outside value that rebootd shows.
pub const MAX_SHOWN: usize = 512;

/// `s` bounded to [`MAX_SHOWN`] characters and escaped.
pub fn clean(s: &str) -> String {
    clean_to(s, MAX_SHOWN)
}

/// `s` escaped and bounded to `max` characters in all: a control character (C0, DEL, C1) or a
/// bidirectional override shows as `\u{..}`, so `ESC[2J` reads `\u{1b}[2J`; past the bound
/// the rest is left out and `… (N more characters)` says how much. Plain text, UTF-8 included,
/// is kept as it is. Cleaning twice is cleaning once.
pub fn clean_to(s: &str, max: usize) -> String {
    if s.len() <= max && !s.chars().any(needs_escape) {
        return s.to_owned();
    }
    let escaped = |c: char| {
        if needs_escape(c) {
            format!("\\u{{{:x}}}", u32::from(c))
        } else {
            c.to_string()
        }
    };
    let whole: Vec<String> = s.chars().map(escaped).collect();
    if whole.iter().map(|p| p.chars().count()).sum::<usize>() <= max {
        return whole.concat();
    }
    // Room for the note on what was left out, at most " (18446744073709551615 more characters)".
    let room = max.saturating_sub(40);
    let mut out = String::new();
    let mut shown = 0usize;
    for (taken, piece) in whole.iter().enumerate() {
        let width = piece.chars().count();
        if shown + width > room {
            return format!("{out}… ({} more characters)", whole.len() - taken);
        }
        out.push_str(piece);
        shown += width;
    }
    out
}

/// Whether `s` would be changed by [`clean`] (cheap check before an allocation).
pub fn is_clean(s: &str) -> bool {
    s.chars().count() <= MAX_SHOWN && !s.chars().any(needs_escape)
}

/// An optional outside value, cleaned.
pub fn clean_opt(s: Option<&str>) -> Option<String> {
    s.map(clean)
}

fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_terminal_sequences_and_keeps_plain_text() {
        assert_eq!(clean("worker-1"), "worker-1");
        assert_eq!(clean("Zürich ✓"), "Zürich ✓");
        assert_eq!(
            clean("\u{1b}[2J\u{1b}]0;owned\u{7}"),
            "\\u{1b}[2J\\u{1b}]0;owned\\u{7}"
        );
        assert_eq!(clean("a\nb\tc\r"), "a\\u{a}b\\u{9}c\\u{d}");
        assert_eq!(clean("\u{9b}31m"), "\\u{9b}31m");
        assert_eq!(clean("x\u{202e}gpj.exe"), "x\\u{202e}gpj.exe");
        assert!(is_clean("worker-1") && !is_clean("\u{1b}"));
    }

    #[test]
    fn bounds_the_length_in_characters_and_cleans_once() {
        let long = "é".repeat(MAX_SHOWN + 10);
        let c = clean(&long);
        assert!(c.chars().count() <= MAX_SHOWN, "{}", c.chars().count());
        assert!(c.starts_with(&"é".repeat(MAX_SHOWN - 40)));
        assert!(c.ends_with(" more characters)"), "{c}");
        assert_eq!(clean(&c), c, "cleaning twice changed it");
        let escapes = "\u{1b}".repeat(MAX_SHOWN);
        let c = clean(&escapes);
        assert!(c.chars().count() <= MAX_SHOWN && !c.contains('\u{1b}'));
        assert_eq!(clean(&c), c);
        assert_eq!(
            clean_to(&"a".repeat(50), 45),
            format!("{}… (45 more characters)", "a".repeat(5))
        );
        assert_eq!(clean_to("abc", 3), "abc");
        assert!(!is_clean(&long));
    }
}
