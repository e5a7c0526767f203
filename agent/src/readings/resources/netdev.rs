//! `/proc/net/dev`: two header lines, then `iface: rx(8 counters) tx(8 counters)`.
//! Interface names may hold a colon-less anything, and old kernels wrote no space after
//! the colon (`eth0:123 ...`), so the name is everything before the last `:` of the
//! label part.

use super::{number, ParseError};

const FILE: &str = "/proc/net/dev";

/// Counters of one interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// Receive counters: bytes, packets, errs, drop, fifo, frame, compressed, multicast.
    pub rx: [u64; 8],
    /// Transmit counters: bytes, packets, errs, drop, fifo, colls, carrier, compressed.
    pub tx: [u64; 8],
}

/// Parses `/proc/net/dev`.
pub fn parse(text: &str) -> Result<Vec<Interface>, ParseError> {
    let mut lines = text.lines().enumerate();
    for _ in 0..2 {
        match lines.next() {
            Some((_, h)) if h.contains('|') => {}
            _ => return Err(ParseError::new(FILE, "missing the two header lines")),
        }
    }
    let mut out = Vec::new();
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("line {}", i + 1);
        let (name, rest) = line
            .rsplit_once(':')
            .ok_or_else(|| ParseError::new(FILE, format!("{at}: no colon")))?;
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() != 16 {
            return Err(ParseError::new(
                FILE,
                format!("{at}: {} counters, expected 16", f.len()),
            ));
        }
        let mut iface = Interface {
            name: name.trim().to_owned(),
            ..Interface::default()
        };
        for j in 0..8 {
            iface.rx[j] = number(FILE, &at, f[j])?;
            iface.tx[j] = number(FILE, &at, f[8 + j])?;
        }
        out.push(iface);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_and_old_layouts() {
        let n = parse(include_str!("testdata/netdev-6.1")).expect("parses");
        assert_eq!(n.len(), 3);
        let eth = n.iter().find(|i| i.name == "eth0").expect("eth0");
        assert_eq!(eth.rx[0], 987_654_321);
        assert_eq!(eth.rx[4], 3, "fifo (overruns)");
        assert_eq!(eth.tx[0], 123_456_789);
        assert_eq!(eth.tx[6], 1, "carrier");
        let n = parse(include_str!("testdata/netdev-2.6")).expect("parses");
        let eth = n.iter().find(|i| i.name == "eth0").expect("eth0");
        assert_eq!(eth.rx[0], 1_234_567_890, "no space after the colon");
    }

    #[test]
    fn malformed() {
        assert!(parse("").is_err());
        let hdr = "Inter-|   Receive\n face |bytes\n";
        assert!(parse(&format!("{hdr}  lo: 1 2 3\n"))
            .unwrap_err()
            .to_string()
            .contains("3 counters"));
        assert!(parse(&format!("{hdr}  lo 1 2 3\n")).is_err());
        assert!(parse(&format!(
            "{hdr}  lo: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 x\n"
        ))
        .is_err());
        assert_eq!(parse(hdr).expect("no interfaces"), vec![]);
    }
}
