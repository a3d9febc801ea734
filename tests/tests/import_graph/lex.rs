//! Rust source as tokens, with comments dropped and literals made opaque, so that nothing
//! written in a comment, a doc comment or a string can look like a path.

/// One token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tok {
    /// An identifier or keyword (`r#name` as `name`).
    Ident(String),
    /// `::`.
    PathSep,
    /// Any other punctuation character.
    Punct(char),
    /// A string literal's text (kept only for `#[path = "…"]`; never scanned for paths).
    Str(String),
    /// A character, byte or number literal, or a lifetime.
    Lit,
}

/// A token and the line it starts on (1-based).
#[derive(Debug, Clone)]
pub struct Token {
    /// The token.
    pub tok: Tok,
    /// Its line.
    pub line: usize,
}

/// The tokens of `src`.
pub fn tokens(src: &str) -> Vec<Token> {
    let mut lexer = Lexer {
        chars: src.chars().collect(),
        at: 0,
        line: 1,
        out: Vec::new(),
    };
    lexer.run();
    lexer.out
}

struct Lexer {
    chars: Vec<char>,
    at: usize,
    line: usize,
    out: Vec<Token>,
}

impl Lexer {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.at + ahead).copied()
    }

    /// Moves past one character, counting lines.
    fn bump(&mut self) -> Option<char> {
        let c = self.peek(0)?;
        self.at += 1;
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn push(&mut self, tok: Tok, line: usize) {
        self.out.push(Token { tok, line });
    }

    fn run(&mut self) {
        while let Some(c) = self.peek(0) {
            let line = self.line;
            match c {
                c if c.is_whitespace() => {
                    self.bump();
                }
                '/' if self.peek(1) == Some('/') => self.line_comment(),
                '/' if self.peek(1) == Some('*') => self.block_comment(),
                '"' => {
                    let text = self.quoted();
                    self.push(Tok::Str(text), line);
                }
                '\'' => self.quote_or_lifetime(line),
                c if c.is_ascii_digit() => self.number(line),
                c if c == '_' || c.is_alphabetic() => self.word(line),
                ':' if self.peek(1) == Some(':') => {
                    self.at += 2;
                    self.push(Tok::PathSep, line);
                }
                c => {
                    self.bump();
                    self.push(Tok::Punct(c), line);
                }
            }
        }
    }

    fn line_comment(&mut self) {
        while let Some(c) = self.peek(0) {
            if c == '\n' {
                return;
            }
            self.bump();
        }
    }

    /// A block comment, nested ones included.
    fn block_comment(&mut self) {
        self.at += 2;
        let mut depth = 1;
        while depth > 0 {
            match (self.peek(0), self.peek(1)) {
                (Some('/'), Some('*')) => {
                    self.at += 2;
                    depth += 1;
                }
                (Some('*'), Some('/')) => {
                    self.at += 2;
                    depth -= 1;
                }
                (Some(_), _) => {
                    self.bump();
                }
                (None, _) => return,
            }
        }
    }

    /// A `"…"` literal with escapes, from its opening quote; returns its text.
    fn quoted(&mut self) -> String {
        self.bump();
        let mut text = String::new();
        while let Some(c) = self.bump() {
            match c {
                '"' => break,
                '\\' => {
                    if let Some(next) = self.bump() {
                        text.push('\\');
                        text.push(next);
                    }
                }
                c => text.push(c),
            }
        }
        text
    }

    /// A raw string from its `#`s or opening quote (`r`/`br`/`cr` already read).
    fn raw_string(&mut self) -> String {
        let mut hashes = 0;
        while self.peek(0) == Some('#') {
            self.bump();
            hashes += 1;
        }
        self.bump(); // the opening quote
        let mut text = String::new();
        while let Some(c) = self.bump() {
            if c == '"' && (0..hashes).all(|i| self.peek(i) == Some('#')) {
                self.at += hashes;
                break;
            }
            text.push(c);
        }
        text
    }

    /// A character literal (`'a'`, `'\n'`, `'\''`) or a lifetime / label (`'a`).
    fn quote_or_lifetime(&mut self, line: usize) {
        self.bump();
        if self.peek(0) == Some('\\') {
            self.bump();
            self.bump();
            while let Some(c) = self.bump() {
                if c == '\'' {
                    break;
                }
            }
        } else if self.peek(1) == Some('\'') {
            self.at += 2;
        } else {
            while self
                .peek(0)
                .is_some_and(|c| c == '_' || c.is_alphanumeric())
            {
                self.bump();
            }
        }
        self.push(Tok::Lit, line);
    }

    fn number(&mut self, line: usize) {
        while let Some(c) = self.peek(0) {
            let fraction = c == '.' && self.peek(1).is_some_and(|d| d.is_ascii_digit());
            if !(c == '_' || c.is_alphanumeric() || fraction) {
                break;
            }
            self.bump();
        }
        self.push(Tok::Lit, line);
    }

    /// An identifier, or the prefix of a byte / raw / C string or a byte literal.
    fn word(&mut self, line: usize) {
        let start = self.at;
        while self
            .peek(0)
            .is_some_and(|c| c == '_' || c.is_alphanumeric())
        {
            self.bump();
        }
        let word: String = self.chars[start..self.at].iter().collect();
        let (next, after) = (self.peek(0), self.peek(1));
        match (word.as_str(), next) {
            ("b" | "c", Some('"')) => {
                let text = self.quoted();
                self.push(Tok::Str(text), line);
            }
            ("r" | "br" | "cr", Some('"')) => {
                let text = self.raw_string();
                self.push(Tok::Str(text), line);
            }
            ("r" | "br" | "cr", Some('#')) if matches!(after, Some('"' | '#')) => {
                let text = self.raw_string();
                self.push(Tok::Str(text), line);
            }
            ("r", Some('#')) => {
                self.bump();
                self.word(line);
            }
            ("b", Some('\'')) => self.quote_or_lifetime(line),
            _ => self.push(Tok::Ident(word), line),
        }
    }
}

#[test]
fn comments_and_literals_hide_paths() {
    let src = r###"
        // crate::a::X
        /* crate::b /* nested crate::c */ still a comment */
        /// [`crate::d`]
        let s = "crate::e \" crate::f";
        let r = r#"crate::g "quoted" "#;
        let c = '"'; let q = '\''; let l: &'static str = b"x";
        crate::h::Y
    "###;
    let idents: Vec<String> = tokens(src)
        .into_iter()
        .filter_map(|t| match t.tok {
            Tok::Ident(s) if s.len() == 1 && s.chars().all(|c| c.is_ascii_lowercase()) => Some(s),
            Tok::Ident(s) if s == "Y" || s == "X" => Some(s),
            _ => None,
        })
        .collect();
    assert_eq!(idents, ["s", "r", "c", "q", "l", "h", "Y"]);
    let last = tokens(src)
        .into_iter()
        .find(|t| t.tok == Tok::Ident("h".into()))
        .unwrap();
    assert_eq!(last.line, 8);
}
