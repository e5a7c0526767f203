//! `/proc/net/snmp` (and `/proc/net/netstat`): pairs of lines, names then values, each
//! starting with the protocol: `Tcp: RtoAlgorithm ... RetransSegs ...` / `Tcp: 1 ... 42 ...`.

use super::ParseError;

const FILE: &str = "/proc/net/snmp";

/// One counter: protocol, name, value. Values can be negative (`Tcp: MaxConn -1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counter {
    /// `Ip`, `Icmp`, `Tcp`, `Udp`, ...
    pub protocol: String,
    /// `RetransSegs`, `InErrors`, ...
    pub name: String,
    /// The value.
    pub value: i64,
}

/// Parses the text.
pub fn parse(text: &str) -> Result<Vec<Counter>, ParseError> {
    let mut out = Vec::new();
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    while let Some((i, names)) = lines.next() {
        let Some((j, values)) = lines.next() else {
            return Err(ParseError::new(
                FILE,
                format!("line {}: a names line without values", i + 1),
            ));
        };
        let (p1, names) = names
            .split_once(':')
            .ok_or_else(|| ParseError::new(FILE, format!("line {}: no protocol", i + 1)))?;
        let (p2, values) = values
            .split_once(':')
            .ok_or_else(|| ParseError::new(FILE, format!("line {}: no protocol", j + 1)))?;
        if p1 != p2 {
            return Err(ParseError::new(
                FILE,
                format!("line {}: {p2:?} values after {p1:?} names", j + 1),
            ));
        }
        let names: Vec<&str> = names.split_whitespace().collect();
        let values: Vec<&str> = values.split_whitespace().collect();
        if names.len() != values.len() {
            return Err(ParseError::new(
                FILE,
                format!(
                    "line {}: {} names but {} values",
                    j + 1,
                    names.len(),
                    values.len()
                ),
            ));
        }
        for (n, v) in names.iter().zip(values) {
            let value = v
                .parse()
                .map_err(|_| ParseError::new(FILE, format!("line {}: {p1} {n}: {v:?}", j + 1)))?;
            out.push(Counter {
                protocol: p1.to_owned(),
                name: (*n).to_owned(),
                value,
            });
        }
    }
    Ok(out)
}

/// The value of `protocol` `name`.
pub fn get(counters: &[Counter], protocol: &str, name: &str) -> Option<i64> {
    counters
        .iter()
        .find(|c| c.protocol == protocol && c.name == name)
        .map(|c| c.value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_6_1() {
        let c = parse(include_str!("testdata/snmp-6.1")).expect("parses");
        assert_eq!(get(&c, "Tcp", "RetransSegs"), Some(4_321));
        assert_eq!(get(&c, "Tcp", "MaxConn"), Some(-1));
        assert_eq!(get(&c, "Udp", "InErrors"), Some(5));
        assert_eq!(get(&c, "Udp", "MemErrors"), Some(0));
        assert_eq!(get(&c, "Tcp", "Nope"), None);
    }

    #[test]
    fn kernel_3_10_has_fewer_udp_columns() {
        let c = parse(include_str!("testdata/snmp-3.10")).expect("parses");
        assert_eq!(get(&c, "Tcp", "RetransSegs"), Some(77));
        assert_eq!(get(&c, "Udp", "MemErrors"), None);
    }

    #[test]
    fn malformed() {
        assert!(parse("Tcp: A B\n")
            .unwrap_err()
            .to_string()
            .contains("without values"));
        assert!(parse("Tcp: A B\nTcp: 1\n")
            .unwrap_err()
            .to_string()
            .contains("2 names but 1"));
        assert!(parse("Tcp: A\nUdp: 1\n").is_err());
        assert!(parse("Tcp: A\nTcp: x\n").is_err());
        assert!(parse("Tcp A\nTcp 1\n").is_err());
        assert_eq!(parse("").expect("empty"), vec![]);
    }
}
