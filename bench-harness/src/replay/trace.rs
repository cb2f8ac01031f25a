//! Trace files as workloads: [`TraceWorkload`] streams a Mooncake JSONL or Azure CSV file line by
//! line (optionally again and again with `--loop`), skips and counts malformed lines, and turns
//! each row into a [`WorkItem`].
//!
//! Mooncake rows carry `hash_ids`, one per 512-token block: each id expands into 512 tokens seeded
//! by the id (and the loop pass, so every pass is fresh content), the last block cut so the prompt
//! is exactly `input_length` tokens. Azure rows carry lengths only: their content is unique per row.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::content::{seed_of, Prompt};
use super::limits::{
    MOONCAKE_BLOCK_TOKENS, OUTPUT_TOKENS_MAX, PROMPT_TOKENS_MAX, TRACE_LINE_BYTES_MAX,
};
use super::workload::{Warnings, WorkItem, Workload};

/// The two trace formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    /// `{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [..]}` per line.
    Mooncake,
    /// `TIMESTAMP,ContextTokens,GeneratedTokens` with a header line.
    Azure,
}

impl TraceFormat {
    /// Guesses the format from the file name: `.jsonl`/`.json` is Mooncake, `.csv` is Azure.
    pub fn from_path(path: &Path) -> Option<Self> {
        match path.extension()?.to_str()? {
            "jsonl" | "json" => Some(Self::Mooncake),
            "csv" => Some(Self::Azure),
            _ => None,
        }
    }
}

/// One valid row of either format.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRow {
    pub timestamp_ms: f64,
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Mooncake only; empty for Azure.
    pub hash_ids: Vec<u64>,
}

#[derive(Deserialize)]
struct MooncakeLine {
    timestamp: f64,
    input_length: u64,
    output_length: u64,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// Parses one Mooncake line.
pub fn parse_mooncake_line(line: &str) -> Result<TraceRow, String> {
    let row: MooncakeLine =
        serde_json::from_str(line).map_err(|e| format!("not a Mooncake row: {e}"))?;
    let blocks_max = PROMPT_TOKENS_MAX.div_ceil(MOONCAKE_BLOCK_TOKENS) as usize;
    if row.hash_ids.len() > blocks_max {
        return Err(format!(
            "{} hash ids, at most {blocks_max}",
            row.hash_ids.len()
        ));
    }
    make_row(
        row.timestamp,
        row.input_length,
        row.output_length,
        row.hash_ids,
    )
}

/// Column positions of an Azure CSV file, read from its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AzureColumns {
    timestamp: usize,
    context_tokens: usize,
    generated_tokens: usize,
}

impl AzureColumns {
    /// Reads the header line (`TIMESTAMP,ContextTokens,GeneratedTokens`, any order).
    pub fn from_header(line: &str) -> Result<Self, String> {
        let names: Vec<&str> = line.trim().split(',').map(str::trim).collect();
        let find = |name: &str| {
            names
                .iter()
                .position(|n| n.eq_ignore_ascii_case(name))
                .ok_or_else(|| format!("the header has no {name} column"))
        };
        Ok(Self {
            timestamp: find("TIMESTAMP")?,
            context_tokens: find("ContextTokens")?,
            generated_tokens: find("GeneratedTokens")?,
        })
    }
}

/// Parses one Azure data line; the timestamp is absolute (ms since the Unix epoch).
pub fn parse_azure_line(line: &str, columns: AzureColumns) -> Result<TraceRow, String> {
    let fields: Vec<&str> = line.trim().split(',').map(str::trim).collect();
    let field = |i: usize| {
        fields
            .get(i)
            .copied()
            .ok_or_else(|| format!("missing column {}", i + 1))
    };
    let timestamp_ms = parse_azure_timestamp(field(columns.timestamp)?)?;
    let number = |i: usize| -> Result<u64, String> {
        let text = field(i)?;
        text.parse()
            .map_err(|_| format!("{text:?} is not a token count"))
    };
    make_row(
        timestamp_ms,
        number(columns.context_tokens)?,
        number(columns.generated_tokens)?,
        Vec::new(),
    )
}

/// `2023-11-16 18:17:03.9799600` → milliseconds since the Unix epoch (UTC, any number of
/// fractional digits).
pub fn parse_azure_timestamp(text: &str) -> Result<f64, String> {
    let bad = || format!("{text:?} is not a YYYY-MM-DD HH:MM:SS[.fff] timestamp");
    let (date, time) = text.split_once([' ', 'T']).ok_or_else(bad)?;
    let mut ymd = date
        .splitn(3, '-')
        .map(|p| p.parse::<i64>().map_err(|_| bad()));
    let (year, month, day) = (
        ymd.next().ok_or_else(bad)??,
        ymd.next().ok_or_else(bad)??,
        ymd.next().ok_or_else(bad)??,
    );
    let mut hms = time.splitn(3, ':');
    let hour: i64 = hms.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let minute: i64 = hms.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let second: f64 = hms.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let in_range = (1..=12).contains(&month) && (1..=31).contains(&day) && (0..24).contains(&hour);
    if !in_range || !(0..60).contains(&minute) || !(0.0..61.0).contains(&second) {
        return Err(bad());
    }
    let days = days_from_civil(year, month, day);
    Ok(((days * 24 + hour) * 60 + minute) as f64 * 60_000.0 + second * 1000.0)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn make_row(
    timestamp_ms: f64,
    input: u64,
    output: u64,
    hash_ids: Vec<u64>,
) -> Result<TraceRow, String> {
    if !timestamp_ms.is_finite() || timestamp_ms < 0.0 {
        return Err(format!("timestamp {timestamp_ms} is not a time"));
    }
    if input == 0 || input > u64::from(PROMPT_TOKENS_MAX) {
        return Err(format!(
            "input length {input} is outside 1..={PROMPT_TOKENS_MAX}"
        ));
    }
    if output > u64::from(OUTPUT_TOKENS_MAX) {
        return Err(format!(
            "output length {output} is above {OUTPUT_TOKENS_MAX}"
        ));
    }
    // An engine always produces at least one token; a zero output still gets a first token.
    let output_tokens = output.max(1) as u32;
    Ok(TraceRow {
        timestamp_ms,
        input_tokens: input as u32,
        output_tokens,
        hash_ids,
    })
}

/// The prompt of a Mooncake row: 512 tokens per hash id (seeded by the id and the loop pass), cut
/// to `input_tokens`; tokens beyond the last block (a row with too few ids) are unique to `id`.
pub fn expand_hash_ids(hash_ids: &[u64], input_tokens: u32, pass: u64, id: u64) -> Prompt {
    let mut prompt = Prompt::default();
    let mut left = input_tokens;
    for &hash_id in hash_ids {
        if left == 0 {
            break;
        }
        let len = left.min(MOONCAKE_BLOCK_TOKENS);
        prompt.push(seed_of("mooncake-block", &[hash_id, pass]), len);
        left -= len;
    }
    prompt.push(seed_of("mooncake-tail", &[id]), left);
    prompt
}

/// A trace file as a workload.
pub struct TraceWorkload {
    path: PathBuf,
    label: String,
    format: TraceFormat,
    repeat: bool,
    reader: BufReader<File>,
    azure_columns: Option<AzureColumns>,
    line_number: u64,
    pass: u64,
    next_id: u64,
    first_timestamp_ms: Option<f64>,
    last_timestamp_ms: f64,
    rows_this_pass: u64,
    pass_offset_ms: f64,
    warnings: Warnings,
    line: Vec<u8>,
}

impl TraceWorkload {
    /// Opens `path`; with `repeat`, the file is read again from the top each time it ends, every
    /// pass with fresh content and timestamps continuing after the previous pass.
    pub fn open(path: &Path, format: TraceFormat, repeat: bool) -> std::io::Result<Self> {
        let reader = BufReader::with_capacity(256 * 1024, File::open(path)?);
        Ok(Self {
            path: path.to_path_buf(),
            label: path.display().to_string(),
            format,
            repeat,
            reader,
            azure_columns: None,
            line_number: 0,
            pass: 0,
            next_id: 0,
            first_timestamp_ms: None,
            last_timestamp_ms: 0.0,
            rows_this_pass: 0,
            pass_offset_ms: 0.0,
            warnings: Warnings::default(),
            line: Vec::new(),
        })
    }

    /// The next valid row, or `None` at the end of the file (or on a read error, which is counted).
    fn next_row(&mut self) -> Option<TraceRow> {
        loop {
            let line_number = self.line_number + 1;
            match read_line_bounded(&mut self.reader, &mut self.line) {
                Ok(LineRead::End) => return None,
                Err(e) => {
                    self.warnings
                        .skip_line(&self.label, line_number, &format!("read error: {e}"));
                    return None;
                }
                Ok(LineRead::TooLong) => {
                    self.line_number = line_number;
                    let why = format!("longer than {TRACE_LINE_BYTES_MAX} bytes");
                    self.warnings.skip_line(&self.label, line_number, &why);
                }
                Ok(LineRead::Line) => {
                    self.line_number = line_number;
                    if let Some(row) = self.parse_current_line(line_number) {
                        return Some(row);
                    }
                }
            }
        }
    }

    fn parse_current_line(&mut self, line_number: u64) -> Option<TraceRow> {
        let Ok(text) = std::str::from_utf8(&self.line) else {
            self.warnings
                .skip_line(&self.label, line_number, "not UTF-8");
            return None;
        };
        let text = text.trim();
        if text.is_empty() {
            return None;
        }
        let parsed = match (self.format, self.azure_columns) {
            (TraceFormat::Mooncake, _) => parse_mooncake_line(text),
            (TraceFormat::Azure, Some(columns)) => parse_azure_line(text, columns),
            (TraceFormat::Azure, None) => match AzureColumns::from_header(text) {
                Ok(columns) => {
                    self.azure_columns = Some(columns);
                    return None;
                }
                Err(e) => Err(e),
            },
        };
        parsed
            .map_err(|why| self.warnings.skip_line(&self.label, line_number, &why))
            .ok()
    }

    /// Starts the next pass of `--loop`; false when the file cannot be read again or had no rows.
    fn rewind(&mut self) -> bool {
        if !self.repeat || self.rows_this_pass == 0 {
            return false;
        }
        let Ok(file) = File::open(&self.path) else {
            self.warnings
                .skip_line(&self.label, 0, "could not reopen the trace for --loop");
            return false;
        };
        let first = self.first_timestamp_ms.unwrap_or(0.0);
        let span_ms = (self.last_timestamp_ms - first).max(0.0);
        // The next pass starts one mean inter-arrival gap after this one's last request.
        let gap_ms = if self.rows_this_pass > 1 {
            span_ms / (self.rows_this_pass - 1) as f64
        } else {
            1.0
        };
        self.pass_offset_ms += span_ms + gap_ms;
        self.reader = BufReader::with_capacity(256 * 1024, file);
        self.azure_columns = None;
        self.line_number = 0;
        self.pass += 1;
        self.rows_this_pass = 0;
        true
    }

    fn item_from_row(&mut self, row: TraceRow) -> WorkItem {
        let id = self.next_id;
        self.next_id += 1;
        self.rows_this_pass += 1;
        let first = *self.first_timestamp_ms.get_or_insert(row.timestamp_ms);
        if self.pass == 0 {
            self.last_timestamp_ms = self.last_timestamp_ms.max(row.timestamp_ms);
        }
        let arrival_ms = self.pass_offset_ms + (row.timestamp_ms - first).max(0.0);
        let (prompt, tenant_key) = match self.format {
            TraceFormat::Mooncake => {
                // The second block is where conversations diverge from the shared system prompt.
                let key = row
                    .hash_ids
                    .get(1)
                    .or(row.hash_ids.first())
                    .copied()
                    .unwrap_or(id);
                (
                    expand_hash_ids(&row.hash_ids, row.input_tokens, self.pass, id),
                    key,
                )
            }
            TraceFormat::Azure => {
                let mut prompt = Prompt::default();
                prompt.push(seed_of("azure-row", &[id]), row.input_tokens);
                (prompt, id)
            }
        };
        WorkItem {
            id,
            arrival_ms: Some(arrival_ms),
            prompt,
            output_tokens: row.output_tokens,
            tenant_key,
        }
    }
}

impl Workload for TraceWorkload {
    fn next_item(&mut self) -> Option<WorkItem> {
        loop {
            if let Some(row) = self.next_row() {
                return Some(self.item_from_row(row));
            }
            if !self.rewind() {
                return None;
            }
        }
    }

    fn warnings(&self) -> &Warnings {
        &self.warnings
    }
}

enum LineRead {
    Line,
    TooLong,
    End,
}

/// Reads one line into `line` (without its end), never buffering more than the line maximum: the
/// rest of an over-long line is read and dropped.
fn read_line_bounded(reader: &mut impl BufRead, line: &mut Vec<u8>) -> std::io::Result<LineRead> {
    line.clear();
    let limit = TRACE_LINE_BYTES_MAX as u64 + 1;
    let read = std::io::Read::take(&mut *reader, limit).read_until(b'\n', line)?;
    if read == 0 {
        return Ok(LineRead::End);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
        return Ok(LineRead::Line);
    }
    if line.len() <= TRACE_LINE_BYTES_MAX {
        return Ok(LineRead::Line); // the last line, without a newline
    }
    let mut rest = Vec::new();
    loop {
        rest.clear();
        let n = std::io::Read::take(&mut *reader, limit).read_until(b'\n', &mut rest)?;
        if n == 0 || rest.last() == Some(&b'\n') {
            return Ok(LineRead::TooLong);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn azure_timestamps_parse_to_epoch_milliseconds() {
        assert_eq!(parse_azure_timestamp("1970-01-01 00:00:01"), Ok(1000.0));
        let a = parse_azure_timestamp("2023-11-16 18:17:03.9799600").unwrap();
        let b = parse_azure_timestamp("2023-11-16 18:17:04.0319600").unwrap();
        assert!((b - a - 52.0).abs() < 1e-3, "{}", b - a);
        // 2023-11-16 is day 19,677 of the Unix epoch.
        assert_eq!(
            parse_azure_timestamp("2023-11-16 00:00:00"),
            Ok(19_677.0 * 86_400_000.0)
        );
        assert!(parse_azure_timestamp("2023-13-16 00:00:00").is_err());
        assert!(parse_azure_timestamp("yesterday").is_err());
    }

    #[test]
    fn rows_outside_the_bounds_are_refused() {
        assert!(
            parse_mooncake_line(r#"{"timestamp":0,"input_length":0,"output_length":1}"#).is_err()
        );
        assert!(
            parse_mooncake_line(r#"{"timestamp":-1,"input_length":5,"output_length":1}"#).is_err()
        );
        let ok = parse_mooncake_line(
            r#"{"timestamp":3,"input_length":5,"output_length":0,"hash_ids":[7]}"#,
        );
        assert_eq!(ok.map(|r| (r.output_tokens, r.hash_ids)), Ok((1, vec![7])));
    }
}
