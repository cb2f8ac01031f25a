//! Reading trace files record by record, never whole: [`read_line_bounded`] (one line, at most a
//! given number of bytes kept) and [`RecordReader`], which yields either the lines of a JSONL file
//! or the elements of a file that is one JSON array (the shape of the ShareGPT dataset files),
//! each with the line number where it starts. A record over its byte maximum is scanned to its end
//! and reported, not buffered.

use std::io::{BufRead, Read};

/// What [`read_line_bounded`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum LineRead {
    Line,
    TooLong,
    End,
}

/// Reads one line into `line` (without its end), never buffering more than `bytes_max`: an
/// over-long line is read to its end and dropped (`line` is left empty).
pub fn read_line_bounded(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    bytes_max: usize,
) -> std::io::Result<LineRead> {
    line.clear();
    let limit = bytes_max as u64 + 1;
    let read = Read::take(&mut *reader, limit).read_until(b'\n', line)?;
    if read == 0 {
        return Ok(LineRead::End);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
        return Ok(LineRead::Line);
    }
    if line.len() <= bytes_max {
        return Ok(LineRead::Line); // the last line, without a newline
    }
    loop {
        let (used, found) = {
            let buf = reader.fill_buf()?;
            match buf.iter().position(|&b| b == b'\n') {
                Some(at) => (at + 1, true),
                None => (buf.len(), buf.is_empty()),
            }
        };
        reader.consume(used);
        if found {
            line.clear();
            return Ok(LineRead::TooLong);
        }
    }
}

/// What [`RecordReader::next_record`] found; every variant but `End` names the line where the
/// record starts.
#[derive(Debug, PartialEq, Eq)]
pub enum RecordRead {
    /// A record, in the caller's buffer.
    Record {
        line_number: u64,
    },
    /// A record longer than the maximum (skipped whole).
    TooLong {
        line_number: u64,
    },
    /// An array element that is not a JSON object.
    NotAnObject {
        line_number: u64,
    },
    /// The file ends inside an array element.
    Truncated {
        line_number: u64,
    },
    End,
}

/// How the file holds its records, found from its first byte that is not whitespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// One record per line (blank lines are ignored).
    Lines,
    /// One top-level JSON array of records.
    Array,
    /// The array's closing bracket was read.
    ArrayEnded,
}

/// Records of a JSONL file, or of a file that is one JSON array.
pub struct RecordReader<R> {
    reader: R,
    layout: Option<Layout>,
    /// Lines fully read so far.
    lines_read: u64,
    bytes_max: usize,
}

impl<R: BufRead> RecordReader<R> {
    pub fn new(reader: R, bytes_max: usize) -> Self {
        Self {
            reader,
            layout: None,
            lines_read: 0,
            bytes_max,
        }
    }

    /// The next record, copied into `out` (cleared first).
    pub fn next_record(&mut self, out: &mut Vec<u8>) -> std::io::Result<RecordRead> {
        out.clear();
        let layout = match self.layout {
            Some(layout) => layout,
            None => {
                let layout = self.detect_layout()?;
                self.layout = Some(layout);
                layout
            }
        };
        match layout {
            Layout::Lines => self.next_line(out),
            Layout::Array => self.next_element(out),
            Layout::ArrayEnded => Ok(RecordRead::End),
        }
    }

    /// Skips leading whitespace (and a UTF-8 byte-order mark, whose bytes never start JSON); an
    /// opening bracket means an array.
    fn detect_layout(&mut self) -> std::io::Result<Layout> {
        match self.skip_separators(b" \t\r\n\xEF\xBB\xBF")? {
            Some(b'[') => {
                self.reader.consume(1);
                Ok(Layout::Array)
            }
            _ => Ok(Layout::Lines),
        }
    }

    /// Consumes bytes of `separators` (counting newlines); returns the next byte, not consumed.
    fn skip_separators(&mut self, separators: &[u8]) -> std::io::Result<Option<u8>> {
        loop {
            let buf = self.reader.fill_buf()?;
            if buf.is_empty() {
                return Ok(None);
            }
            let used = buf
                .iter()
                .position(|b| !separators.contains(b))
                .unwrap_or(buf.len());
            let newlines = buf[..used].iter().filter(|&&b| b == b'\n').count();
            let next = buf.get(used).copied();
            self.lines_read += newlines as u64;
            self.reader.consume(used);
            if next.is_some() {
                return Ok(next);
            }
        }
    }

    fn next_line(&mut self, out: &mut Vec<u8>) -> std::io::Result<RecordRead> {
        loop {
            let line_number = self.lines_read + 1;
            let read = read_line_bounded(&mut self.reader, out, self.bytes_max)?;
            self.lines_read += 1;
            match read {
                LineRead::End => return Ok(RecordRead::End),
                LineRead::TooLong => return Ok(RecordRead::TooLong { line_number }),
                LineRead::Line if out.iter().all(u8::is_ascii_whitespace) => continue,
                LineRead::Line => return Ok(RecordRead::Record { line_number }),
            }
        }
    }

    fn next_element(&mut self, out: &mut Vec<u8>) -> std::io::Result<RecordRead> {
        let first = match self.skip_separators(b" \t\r\n,")? {
            None => return Ok(RecordRead::End),
            Some(b']') => {
                self.reader.consume(1);
                self.layout = Some(Layout::ArrayEnded);
                return Ok(RecordRead::End);
            }
            Some(byte) => byte,
        };
        let line_number = self.lines_read + 1;
        let mut scan = ElementScan::default();
        let mut kept = true;
        loop {
            let buf = self.reader.fill_buf()?;
            if buf.is_empty() {
                return Ok(RecordRead::Truncated { line_number });
            }
            let (used, done) = scan.advance(buf);
            self.lines_read += memchr::memchr_iter(b'\n', &buf[..used]).count() as u64;
            kept = kept && out.len() + used <= self.bytes_max;
            if kept {
                out.extend_from_slice(&buf[..used]);
            }
            self.reader.consume(used);
            if done {
                break;
            }
        }
        if !kept {
            out.clear();
        }
        Ok(match (first, kept) {
            (b'{', true) => RecordRead::Record { line_number },
            (b'{', false) => RecordRead::TooLong { line_number },
            _ => RecordRead::NotAnObject { line_number },
        })
    }
}

/// Where a scan through one JSON value stands: brackets open, inside a string, after a backslash.
#[derive(Default)]
struct ElementScan {
    depth: u32,
    in_string: bool,
    escaped: bool,
    started: bool,
}

impl ElementScan {
    /// Scans `buf`; returns how many bytes belong to the value and whether it ended. An object or
    /// array ends with its closing bracket (included); a scalar before a comma, bracket or
    /// whitespace (not included). Inside a string it jumps to the next quote or backslash.
    fn advance(&mut self, buf: &[u8]) -> (usize, bool) {
        let mut i = 0;
        while i < buf.len() {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                    i += 1;
                    continue;
                }
                let Some(at) = memchr::memchr2(b'"', b'\\', &buf[i..]) else {
                    return (buf.len(), false);
                };
                i += at;
                match buf[i] {
                    b'"' => self.in_string = false,
                    _ => self.escaped = true,
                }
                i += 1;
                continue;
            }
            let at_top = self.depth == 0;
            match buf[i] {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' if !at_top => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        return (i + 1, true);
                    }
                }
                b',' | b']' | b'}' | b' ' | b'\t' | b'\r' | b'\n' if at_top && self.started => {
                    return (i, true);
                }
                _ => {}
            }
            self.started = true;
            i += 1;
        }
        (buf.len(), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads every record, with a reader buffer of `capacity` bytes (small ones split records
    /// across reads).
    fn records(text: &str, capacity: usize, bytes_max: usize) -> Vec<(RecordRead, String)> {
        let reader = std::io::BufReader::with_capacity(capacity, text.as_bytes());
        let mut records = RecordReader::new(reader, bytes_max);
        let mut out = Vec::new();
        let mut all = Vec::new();
        loop {
            let read = records.next_record(&mut out).unwrap();
            if read == RecordRead::End {
                return all;
            }
            all.push((read, String::from_utf8(out.clone()).unwrap()));
        }
    }

    #[test]
    fn array_elements_are_read_one_by_one_with_their_line_numbers() {
        let text = "\u{feff} [\n{\"a\": \"}]\\\"{\"},\n  {\"b\": [1, {\"c\": 2}]}\n,{}\n]\n{\"ignored\":1}";
        for capacity in [1, 2, 3, 7, 64, 8192] {
            let all = records(text, capacity, 1024);
            let expected = vec![
                (
                    RecordRead::Record { line_number: 2 },
                    "{\"a\": \"}]\\\"{\"}".to_string(),
                ),
                (
                    RecordRead::Record { line_number: 3 },
                    "{\"b\": [1, {\"c\": 2}]}".to_string(),
                ),
                (RecordRead::Record { line_number: 4 }, "{}".to_string()),
            ];
            assert_eq!(all, expected, "reader capacity {capacity}");
        }
    }

    #[test]
    fn long_scalar_and_cut_elements_are_reported() {
        let text = "[{\"x\": \"0123456789\"}, 42, \"s\", {\"y\": 1}, {\"z\": ";
        let kinds: Vec<RecordRead> = records(text, 4, 12).into_iter().map(|r| r.0).collect();
        assert_eq!(
            kinds,
            vec![
                RecordRead::TooLong { line_number: 1 },
                RecordRead::NotAnObject { line_number: 1 },
                RecordRead::NotAnObject { line_number: 1 },
                RecordRead::Record { line_number: 1 },
                RecordRead::Truncated { line_number: 1 },
            ]
        );
    }

    #[test]
    fn jsonl_lines_keep_their_numbers_and_skip_blanks() {
        let text = "\n{\"a\":1}\n\n{\"bbbbbbbbbbbbbbbbbbbb\":2}\n{\"c\":3}";
        let all = records(text, 5, 10);
        let expected = vec![
            (
                RecordRead::Record { line_number: 2 },
                "{\"a\":1}".to_string(),
            ),
            (RecordRead::TooLong { line_number: 4 }, String::new()),
            (
                RecordRead::Record { line_number: 5 },
                "{\"c\":3}".to_string(),
            ),
        ];
        assert_eq!(all, expected);
    }

    #[test]
    fn an_over_long_line_is_dropped_and_the_next_one_read() {
        let text = format!("{}\nnext\n", "x".repeat(100));
        let mut reader = std::io::BufReader::with_capacity(8, text.as_bytes());
        let mut line = Vec::new();
        let first = read_line_bounded(&mut reader, &mut line, 10).unwrap();
        assert_eq!(first, LineRead::TooLong);
        assert_eq!(
            read_line_bounded(&mut reader, &mut line, 10).unwrap(),
            LineRead::Line
        );
        assert_eq!(line, b"next");
    }
}
