//! Kubernetes label selectors, as the include/exclude filters spell them.

use std::collections::BTreeMap;

/// A parsed Kubernetes label selector: requirements that must all hold.
///
/// The string syntax of `kubectl -l` and `labelSelector=`: comma-separated requirements
/// `key`, `!key`, `key=value`, `key==value`, `key!=value`, `key in (v1,v2)`,
/// `key notin (v1,v2)`, with blanks allowed between tokens. `!=` and `notin` also hold when
/// the label is absent; the empty selector matches everything. Keys and values are checked
/// as Kubernetes checks them; the numeric `<`/`>` operators are not supported.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Exists,
    DoesNotExist,
    /// `=`, `==` (one value) and `in`.
    In(Vec<String>),
    /// `!=` (one value) and `notin`.
    NotIn(Vec<String>),
}

/// Why a label selector string is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A token where another was expected; `found` is empty at the end of the string.
    #[error("label selector: found {found:?} at byte {at}, expected {expected}")]
    Syntax {
        /// Byte offset of the token.
        at: usize,
        /// The token found.
        found: String,
        /// What would have been valid there.
        expected: &'static str,
    },
    /// Not a valid label key (`[prefix/]name`, name ≤ 63 characters).
    #[error("label selector: invalid label key {0:?}")]
    InvalidKey(String),
    /// Not a valid label value (≤ 63 alphanumerics, `-`, `_`, `.`, alphanumeric at both ends).
    #[error("label selector: invalid label value {0:?}")]
    InvalidValue(String),
    /// `in ()` or `notin ()`.
    #[error("label selector: no values for {0:?}")]
    EmptySet(String),
}

impl Selector {
    /// Parses a selector string; see [`Selector`] for the syntax.
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        let tokens = lex(selector);
        let mut parser = Parser {
            tokens: &tokens,
            pos: 0,
            end: selector.len(),
        };
        let mut requirements = Vec::new();
        if tokens.is_empty() {
            return Ok(Self { requirements });
        }
        loop {
            requirements.push(parser.requirement()?);
            match parser.next() {
                None => return Ok(Self { requirements }),
                Some((_, Token::Comma)) => {}
                Some((at, token)) => return Err(syntax(at, token, "',' or the end")),
            }
        }
    }

    /// Whether the labels satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| {
            let value = labels.get(&r.key);
            match &r.op {
                Op::Exists => value.is_some(),
                Op::DoesNotExist => value.is_none(),
                Op::In(values) => value.is_some_and(|v| values.contains(v)),
                Op::NotIn(values) => value.is_none_or(|v| !values.contains(v)),
            }
        })
    }
}

impl std::str::FromStr for Selector {
    type Err = SelectorError;

    fn from_str(selector: &str) -> Result<Self, SelectorError> {
        Self::parse(selector)
    }
}

/// Parses `selector` and matches it against `labels`; parse once with [`Selector::parse`]
/// to match many times.
pub fn matches_selector(
    labels: &BTreeMap<String, String>,
    selector: &str,
) -> Result<bool, SelectorError> {
    Ok(Selector::parse(selector)?.matches(labels))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token<'a> {
    /// A key, a value, `in` or `notin`: a run of anything but blanks and the signs below.
    Word(&'a str),
    Not,
    Equals,
    NotEquals,
    Open,
    Close,
    Comma,
    /// `<`, `>` and anything else the grammar has no use for.
    Other(&'a str),
}

impl Token<'_> {
    fn text(&self) -> &str {
        match self {
            Token::Word(s) | Token::Other(s) => s,
            Token::Not => "!",
            Token::Equals => "=",
            Token::NotEquals => "!=",
            Token::Open => "(",
            Token::Close => ")",
            Token::Comma => ",",
        }
    }
}

fn syntax(at: usize, token: Token<'_>, expected: &'static str) -> SelectorError {
    SelectorError::Syntax {
        at,
        found: token.text().to_owned(),
        expected,
    }
}

/// Splits a selector into (byte offset, token).
fn lex(s: &str) -> Vec<(usize, Token<'_>)> {
    const SIGNS: &[char] = &['!', '=', '(', ')', ',', '<', '>'];
    let mut tokens = Vec::new();
    let mut rest = s.char_indices().peekable();
    while let Some((at, c)) = rest.next() {
        let token = match c {
            c if c.is_whitespace() => continue,
            '!' | '=' if rest.peek().is_some_and(|&(_, n)| n == '=') => {
                rest.next();
                if c == '!' {
                    Token::NotEquals
                } else {
                    Token::Equals
                }
            }
            '!' => Token::Not,
            '=' => Token::Equals,
            '(' => Token::Open,
            ')' => Token::Close,
            ',' => Token::Comma,
            '<' | '>' => Token::Other(&s[at..at + 1]),
            _ => {
                let mut end = s.len();
                while let Some(&(i, n)) = rest.peek() {
                    if n.is_whitespace() || SIGNS.contains(&n) {
                        end = i;
                        break;
                    }
                    rest.next();
                }
                Token::Word(&s[at..end])
            }
        };
        tokens.push((at, token));
    }
    tokens
}

struct Parser<'t, 's> {
    tokens: &'t [(usize, Token<'s>)],
    pos: usize,
    /// Offset reported for "the end of the string".
    end: usize,
}

impl<'s> Parser<'_, 's> {
    fn peek(&self) -> Option<(usize, Token<'s>)> {
        self.tokens.get(self.pos).copied()
    }

    fn next(&mut self) -> Option<(usize, Token<'s>)> {
        let token = self.peek();
        self.pos += usize::from(token.is_some());
        token
    }

    fn expect_word(&mut self, expected: &'static str) -> Result<&'s str, SelectorError> {
        match self.next() {
            Some((_, Token::Word(word))) => Ok(word),
            Some((at, token)) => Err(syntax(at, token, expected)),
            None => Err(syntax(self.end, Token::Word(""), expected)),
        }
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        if let Some((_, Token::Not)) = self.peek() {
            self.next();
            let key = key(self.expect_word("a label key after '!'")?)?;
            return Ok(Requirement {
                key,
                op: Op::DoesNotExist,
            });
        }
        let key = key(self.expect_word("a label key or '!'")?)?;
        let op = match self.peek() {
            None | Some((_, Token::Comma)) => Op::Exists,
            Some((_, Token::Equals)) => {
                self.next();
                Op::In(vec![self.single_value()?])
            }
            Some((_, Token::NotEquals)) => {
                self.next();
                Op::NotIn(vec![self.single_value()?])
            }
            Some((_, Token::Word("in"))) => {
                self.next();
                Op::In(self.value_set(&key)?)
            }
            Some((_, Token::Word("notin"))) => {
                self.next();
                Op::NotIn(self.value_set(&key)?)
            }
            Some((at, token)) => {
                return Err(syntax(at, token, "'=', '==', '!=', 'in', 'notin' or ','"))
            }
        };
        Ok(Requirement { key, op })
    }

    /// The value after `=`, `==` or `!=`; empty when a comma or the end follows.
    fn single_value(&mut self) -> Result<String, SelectorError> {
        match self.peek() {
            None | Some((_, Token::Comma)) => Ok(String::new()),
            _ => value(self.expect_word("a label value")?),
        }
    }

    /// `( v1, v2, … )`; an empty element is the empty value, as in Kubernetes.
    fn value_set(&mut self, key: &str) -> Result<Vec<String>, SelectorError> {
        match self.next() {
            Some((_, Token::Open)) => {}
            Some((at, token)) => return Err(syntax(at, token, "'('")),
            None => return Err(syntax(self.end, Token::Word(""), "'('")),
        }
        if let Some((_, Token::Close)) = self.peek() {
            return Err(SelectorError::EmptySet(key.to_owned()));
        }
        let mut values = Vec::new();
        loop {
            let element = match self.peek() {
                Some((_, Token::Word(word))) => {
                    self.next();
                    value(word)?
                }
                _ => String::new(),
            };
            values.push(element);
            match self.next() {
                Some((_, Token::Comma)) => {}
                Some((_, Token::Close)) => return Ok(values),
                Some((at, token)) => return Err(syntax(at, token, "',' or ')'")),
                None => return Err(syntax(self.end, Token::Word(""), "',' or ')'")),
            }
        }
    }
}

/// A label name or value part: 1 to 63 of `[A-Za-z0-9._-]`, alphanumeric at both ends.
fn is_label_name(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    s.len() <= 63
        && s.bytes().next().is_some_and(alnum)
        && s.bytes().last().is_some_and(alnum)
        && s.bytes()
            .all(|b| alnum(b) || matches!(b, b'-' | b'_' | b'.'))
}

/// A DNS-1123 subdomain: at most 253 characters, dot-separated lowercase alphanumeric labels
/// with inner `-`.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
            label.bytes().next().is_some_and(ok)
                && label.bytes().last().is_some_and(ok)
                && label.bytes().all(|b| ok(b) || b == b'-')
        })
}

/// Checks a label key: `[prefix/]name`.
fn key(word: &str) -> Result<String, SelectorError> {
    let valid = match word.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_label_name(name),
        None => is_label_name(word),
    };
    valid
        .then(|| word.to_owned())
        .ok_or_else(|| SelectorError::InvalidKey(word.to_owned()))
}

/// Checks a non-empty label value.
fn value(word: &str) -> Result<String, SelectorError> {
    is_label_name(word)
        .then(|| word.to_owned())
        .ok_or_else(|| SelectorError::InvalidValue(word.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn selectors_match_like_kubernetes() {
        let l = labels(&[
            ("app", "web"),
            ("tier", "frontend"),
            ("app.kubernetes.io/name", "shop"),
            ("empty", ""),
        ]);
        let cases: &[(&str, bool)] = &[
            ("", true),
            ("   ", true),
            ("app=web", true),
            ("app==web", true),
            ("app = web", true),
            ("app=db", false),
            ("app!=db", true),
            ("app!=web", false),
            ("missing!=x", true),
            ("app", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("app in (web,db)", true),
            ("app in(db, cache)", false),
            ("missing in (x)", false),
            ("app notin (db)", true),
            ("app notin (db, web)", false),
            ("missing notin (x)", true),
            ("app=web,tier=frontend", true),
            ("app=web, tier=backend", false),
            ("app=web,!missing,tier in (frontend)", true),
            ("app.kubernetes.io/name=shop", true),
            ("empty=", true),
            ("empty in (,x)", true),
            ("app in (x,)", false),
            ("empty!=", false),
            ("app=web,app=db", false),
        ];
        for (selector, want) in cases {
            assert_eq!(
                matches_selector(&l, selector),
                Ok(*want),
                "selector {selector:?}"
            );
        }
        let parsed: Selector = "tier in (frontend),app".parse().expect("parse");
        assert!(parsed.matches(&l));
        assert!(!parsed.matches(&labels(&[("tier", "frontend")])));
    }

    #[test]
    fn invalid_selectors_are_errors() {
        let syntax = |s: &str| matches!(Selector::parse(s), Err(SelectorError::Syntax { .. }));
        for s in [
            "=web",
            "app=web=x",
            "app===web",
            "app in web",
            "app in (web",
            "app in (a b)",
            "app notin",
            "app,",
            ",app",
            "app,,tier",
            "!app=web",
            "!",
            "app web",
            "app > 3",
            "app=(x)",
            "app)",
        ] {
            assert!(syntax(s), "{s:?} gave {:?}", Selector::parse(s));
        }
        assert_eq!(
            Selector::parse("app in ()"),
            Err(SelectorError::EmptySet("app".to_owned()))
        );
        for s in [
            "-app=x",
            "a b/c=x",
            "Example.com/app=x",
            &format!("{}=x", "k".repeat(64)),
        ] {
            assert!(
                matches!(
                    Selector::parse(s),
                    Err(SelectorError::InvalidKey(_) | SelectorError::Syntax { .. })
                ),
                "{s:?} gave {:?}",
                Selector::parse(s)
            );
        }
        assert_eq!(
            Selector::parse("app=-web"),
            Err(SelectorError::InvalidValue("-web".to_owned()))
        );
        assert_eq!(
            Selector::parse("app in (ok, bad!)").map(|_| ()),
            Err(SelectorError::Syntax {
                at: 15,
                found: "!".to_owned(),
                expected: "',' or ')'"
            })
        );
        assert_eq!(
            Selector::parse(&format!("app={}", "v".repeat(64))),
            Err(SelectorError::InvalidValue("v".repeat(64)))
        );
        assert!(Selector::parse("example.com/app-name_1.x=v.1-a_b").is_ok());
        // Errors say where.
        let err = Selector::parse("app=web,").expect_err("trailing comma");
        assert_eq!(
            err.to_string(),
            "label selector: found \"\" at byte 8, expected a label key or '!'"
        );
    }
}
