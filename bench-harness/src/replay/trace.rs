//! Timestamped trace files as workloads: [`TraceWorkload`] streams a Mooncake JSONL, Azure CSV,
//! captured request log or token-id trace line by line (optionally again and again with `--loop`),
//! skips and counts malformed lines by kind, and turns each row into a [`WorkItem`].
//!
//! Mooncake rows carry `hash_ids`, one per 512-token block: each id expands into 512 tokens seeded
//! by the id (and the loop pass, so every pass is fresh content), the last block cut so the prompt
//! is exactly `input_length` tokens. Azure rows carry lengths only: their content is unique per row.
//! Captured requests (`captured`) and token ids (`token_ids`) are real prompts, sent as they are;
//! later `--loop` passes mark them so that each pass is fresh content too (`loop-<pass>` before the
//! text, or the pass number as one more leading id). ShareGPT conversations have no timestamps
//! and are read by `sharegpt`.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use xxhash_rust::xxh3::xxh3_64;

use super::captured::{parse_captured_line, CapturedLine};
use super::content::{seed_of, Prompt};
use super::conversation::ChatPrompt;
use super::limits::{
    CAPTURED_LINE_BYTES_MAX, MOONCAKE_BLOCK_TOKENS, OUTPUT_TOKENS_MAX, PROMPT_TOKENS_MAX,
    TOKEN_IDS_LINE_BYTES_MAX, TRACE_LINE_BYTES_MAX,
};
use super::records::{read_line_bounded, LineRead};
use super::skip::{Skip, SkipKind, Warnings};
use super::token_ids::{parse_token_ids_line, TokenDecoder, TokenIds, TokenIdsRow};
use super::workload::{Content, WorkItem, Workload};

/// The timestamped trace formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    /// `{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [..]}` per line.
    Mooncake,
    /// `TIMESTAMP,ContextTokens,GeneratedTokens` with a header line.
    Azure,
    /// `{"timestamp_ms": ms, "endpoint": "/v1/chat/completions", "body": {..}}` per line.
    OpenaiLog,
    /// `{"input_tok_ids": [..], "output_toks": n, "arrival_time_ns": ns}` per line.
    TokenIds,
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

    /// The `--trace-format` name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Mooncake => "mooncake",
            Self::Azure => "azure",
            Self::OpenaiLog => "openai-log",
            Self::TokenIds => "token-ids",
        }
    }

    /// The longest line read; longer ones are skipped.
    fn line_bytes_max(self) -> usize {
        match self {
            Self::Mooncake | Self::Azure => TRACE_LINE_BYTES_MAX,
            Self::OpenaiLog => CAPTURED_LINE_BYTES_MAX,
            Self::TokenIds => TOKEN_IDS_LINE_BYTES_MAX,
        }
    }
}

/// One valid row of the length-only formats (Mooncake, Azure).
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
pub fn parse_mooncake_line(line: &str) -> Result<TraceRow, Skip> {
    let row: MooncakeLine = serde_json::from_str(line)
        .map_err(|e| Skip::malformed(format!("not a Mooncake row: {e}")))?;
    let blocks_max = PROMPT_TOKENS_MAX.div_ceil(MOONCAKE_BLOCK_TOKENS) as usize;
    if row.hash_ids.len() > blocks_max {
        return Err(Skip::out_of_bounds(format!(
            "{} hash ids, at most {blocks_max}",
            row.hash_ids.len()
        )));
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
    pub fn from_header(line: &str) -> Result<Self, Skip> {
        let names: Vec<&str> = line.trim().split(',').map(str::trim).collect();
        let find = |name: &str| {
            names
                .iter()
                .position(|n| n.eq_ignore_ascii_case(name))
                .ok_or_else(|| Skip::malformed(format!("the header has no {name} column")))
        };
        Ok(Self {
            timestamp: find("TIMESTAMP")?,
            context_tokens: find("ContextTokens")?,
            generated_tokens: find("GeneratedTokens")?,
        })
    }
}

/// Parses one Azure data line; the timestamp is absolute (ms since the Unix epoch).
pub fn parse_azure_line(line: &str, columns: AzureColumns) -> Result<TraceRow, Skip> {
    let fields: Vec<&str> = line.trim().split(',').map(str::trim).collect();
    let field = |i: usize| {
        fields
            .get(i)
            .copied()
            .ok_or_else(|| Skip::malformed(format!("missing column {}", i + 1)))
    };
    let timestamp_ms = parse_azure_timestamp(field(columns.timestamp)?).map_err(Skip::malformed)?;
    let number = |i: usize| -> Result<u64, Skip> {
        let text = field(i)?;
        text.parse()
            .map_err(|_| Skip::malformed(format!("{text:?} is not a token count")))
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
) -> Result<TraceRow, Skip> {
    if !timestamp_ms.is_finite() || timestamp_ms < 0.0 {
        return Err(Skip::out_of_bounds(format!(
            "timestamp {timestamp_ms} is not a time"
        )));
    }
    if input == 0 || input > u64::from(PROMPT_TOKENS_MAX) {
        return Err(Skip::out_of_bounds(format!(
            "input length {input} is outside 1..={PROMPT_TOKENS_MAX}"
        )));
    }
    if output > u64::from(OUTPUT_TOKENS_MAX) {
        return Err(Skip::out_of_bounds(format!(
            "output length {output} is above {OUTPUT_TOKENS_MAX}"
        )));
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

/// One valid line of any timestamped format.
enum Row {
    Lengths(TraceRow),
    Captured(CapturedLine),
    /// With `--tokenizer-path`, `text` is what the ids decode to.
    TokenIds {
        row: TokenIdsRow,
        text: Option<String>,
    },
}

impl Row {
    fn timestamp_ms(&self) -> f64 {
        match self {
            Row::Lengths(row) => row.timestamp_ms,
            Row::Captured(line) => line.timestamp_ms,
            Row::TokenIds { row, .. } => row.timestamp_ms,
        }
    }
}

/// A trace file as a workload.
pub struct TraceWorkload {
    path: PathBuf,
    label: String,
    format: TraceFormat,
    repeat: bool,
    reader: BufReader<File>,
    azure_columns: Option<AzureColumns>,
    /// Decodes token ids to text (`--tokenizer-path`).
    decoder: Option<TokenDecoder>,
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
            decoder: None,
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

    /// Token-id rows are decoded by `decoder` and sent as text (`--tokenizer-path`).
    pub fn decoding_with(mut self, decoder: TokenDecoder) -> Self {
        self.decoder = Some(decoder);
        self
    }

    /// The next valid row, or `None` at the end of the file (or on a read error, which is counted).
    fn next_row(&mut self) -> Option<Row> {
        let bytes_max = self.format.line_bytes_max();
        loop {
            let line_number = self.line_number + 1;
            match read_line_bounded(&mut self.reader, &mut self.line, bytes_max) {
                Ok(LineRead::End) => return None,
                Err(e) => {
                    let skip = Skip::new(SkipKind::Unreadable, format!("read error: {e}"));
                    self.warnings.skip_line(&self.label, line_number, &skip);
                    return None;
                }
                Ok(LineRead::TooLong) => {
                    self.line_number = line_number;
                    let skip =
                        Skip::new(SkipKind::TooLong, format!("longer than {bytes_max} bytes"));
                    self.warnings.skip_line(&self.label, line_number, &skip);
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

    fn parse_current_line(&mut self, line_number: u64) -> Option<Row> {
        let Ok(text) = std::str::from_utf8(&self.line) else {
            let skip = Skip::new(SkipKind::Unreadable, "not UTF-8");
            self.warnings.skip_line(&self.label, line_number, &skip);
            return None;
        };
        let text = text.trim();
        if text.is_empty() {
            return None;
        }
        let parsed = match (self.format, self.azure_columns) {
            (TraceFormat::Mooncake, _) => parse_mooncake_line(text).map(Row::Lengths),
            (TraceFormat::Azure, Some(columns)) => {
                parse_azure_line(text, columns).map(Row::Lengths)
            }
            (TraceFormat::Azure, None) => match AzureColumns::from_header(text) {
                Ok(columns) => {
                    self.azure_columns = Some(columns);
                    return None;
                }
                Err(e) => Err(e),
            },
            (TraceFormat::OpenaiLog, _) => parse_captured_line(text).map(Row::Captured),
            (TraceFormat::TokenIds, _) => parse_token_ids_line(text).and_then(|row| {
                let text = self
                    .decoder
                    .as_ref()
                    .map(|d| d.decode(&row.ids))
                    .transpose()?;
                Ok(Row::TokenIds { row, text })
            }),
        };
        parsed
            .map_err(|skip| self.warnings.skip_line(&self.label, line_number, &skip))
            .ok()
    }

    /// Starts the next pass of `--loop`; false when the file cannot be read again or had no rows.
    fn rewind(&mut self) -> bool {
        if !self.repeat || self.rows_this_pass == 0 {
            return false;
        }
        let Ok(file) = File::open(&self.path) else {
            let skip = Skip::new(
                SkipKind::Unreadable,
                "could not reopen the trace for --loop",
            );
            self.warnings.skip_line(&self.label, 0, &skip);
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

    fn item_from_row(&mut self, row: Row) -> WorkItem {
        let id = self.next_id;
        self.next_id += 1;
        self.rows_this_pass += 1;
        let timestamp_ms = row.timestamp_ms();
        let first = *self.first_timestamp_ms.get_or_insert(timestamp_ms);
        if self.pass == 0 {
            self.last_timestamp_ms = self.last_timestamp_ms.max(timestamp_ms);
        }
        let arrival_ms = self.pass_offset_ms + (timestamp_ms - first).max(0.0);
        let (content, output_tokens, tenant_key) = match row {
            Row::Lengths(row) => self.lengths_content(row, id),
            Row::Captured(line) => {
                let mut request = line.request;
                if self.pass > 0 {
                    request.mark_pass(self.pass);
                }
                let output_tokens = request.output_tokens().unwrap_or(0);
                (Content::Captured(request), output_tokens, id)
            }
            Row::TokenIds { row, text } => {
                let key = prefix_key(&row.ids);
                let content = match text {
                    Some(text) if self.pass > 0 => {
                        Content::Chat(ChatPrompt::user_text(&format!("loop-{} {text}", self.pass)))
                    }
                    Some(text) => Content::Chat(ChatPrompt::user_text(&text)),
                    None => {
                        let mut ids = row.ids;
                        if self.pass > 0 {
                            // Passes beyond 2^32 would repeat a marker; a replay never gets there.
                            ids.prepend(self.pass as u32);
                        }
                        Content::TokenIds(ids)
                    }
                };
                (content, row.output_tokens, key)
            }
        };
        WorkItem {
            id,
            arrival_ms: Some(arrival_ms),
            content,
            output_tokens,
            tenant_key,
        }
    }

    /// The seeded prompt of a Mooncake or Azure row, with its output length and tenant key.
    fn lengths_content(&self, row: TraceRow, id: u64) -> (Content, u32, u64) {
        let (prompt, tenant_key) = match self.format {
            TraceFormat::Azure => {
                let mut prompt = Prompt::default();
                prompt.push(seed_of("azure-row", &[id]), row.input_tokens);
                (prompt, id)
            }
            // Mooncake, the other length-only format.
            _ => {
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
        };
        (Content::Generated(prompt), row.output_tokens, tenant_key)
    }
}

/// The tenant key of a token-id prompt: a hash of its second 512-token block (its first when
/// shorter), where conversations diverge from a shared system prompt, as for Mooncake rows.
fn prefix_key(ids: &TokenIds) -> u64 {
    let block = MOONCAKE_BLOCK_TOKENS as usize;
    let index = usize::from(ids.len() > block);
    xxh3_64(ids.block_text(block, index).as_bytes())
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
