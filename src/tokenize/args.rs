//! The tokenizer flags, with SMG's names and defaults ([`TokenizerArgs`], flattened into the
//! gateway's command line), and the `[MODEL=]PATH` form of their values ([`ModelSpec`]). The
//! files themselves are read by `config` at start; nothing here touches the file system.

use crate::limits::{
    TOKENIZER_CACHE_L0_ENTRIES_DEFAULT, TOKENIZER_CACHE_L1_BYTES_DEFAULT,
    TOKENIZE_INLINE_BYTES_DEFAULT,
};

/// The tokenizer flags. Each path flag takes `PATH` (every model) or `MODEL=PATH` (requests
/// whose `model` is MODEL), and may be repeated; a model's own value wins over the one for
/// every model.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Tokenizer")]
pub struct TokenizerArgs {
    /// Model directory holding tokenizer.json (and tokenizer_config.json, chat_template.jinja),
    /// or a tokenizer.json file, as `PATH` for every model or `MODEL=PATH` for one (repeat the
    /// flag per model). Local paths only: kvgate does not download from the hub. Requests of a
    /// model with a tokenizer route on token IDs; others on their text.
    #[arg(long = "model-path", alias = "model", value_name = "[MODEL=]PATH")]
    pub model_path: Vec<String>,
    /// Tokenizer directory or tokenizer.json file; overrides --model-path for the tokenizer.
    /// `PATH` or `MODEL=PATH`, repeatable, as --model-path.
    #[arg(long = "tokenizer-path", value_name = "[MODEL=]PATH")]
    pub tokenizer_path: Vec<String>,
    /// Chat template file (.jinja, or .json with a "chat_template" field); overrides the one
    /// found beside the tokenizer. `FILE` or `MODEL=FILE`, repeatable.
    #[arg(long = "chat-template", value_name = "[MODEL=]FILE")]
    pub chat_template: Vec<String>,
    /// Do not fetch the tokenizer of a grpc:// worker's model from the worker (its
    /// GetTokenizer call) when no --model-path/--tokenizer-path gives one: requests for that
    /// model then need input_ids. (SMG's flag also skips loading --model-path/--tokenizer-path
    /// at start, for tokenizers registered through its API; kvgate has no such API and still
    /// loads them.)
    #[arg(long = "disable-tokenizer-autoload")]
    pub disable_autoload: bool,
    /// Enable the L0 cache: whole prompts' token IDs (split evenly over the data cores).
    #[arg(long = "tokenizer-cache-enable-l0")]
    pub cache_enable_l0: bool,
    /// Whole prompts the L0 cache keeps (all data cores together).
    #[arg(long = "tokenizer-cache-l0-max-entries", default_value_t = TOKENIZER_CACHE_L0_ENTRIES_DEFAULT)]
    pub cache_l0_max_entries: usize,
    /// Enable the L1 cache: the token IDs of each prompt segment between special tokens (system
    /// prompts, earlier turns, tool definitions), so only new segments are tokenized.
    #[arg(long = "tokenizer-cache-enable-l1")]
    pub cache_enable_l1: bool,
    /// Bytes the L1 cache may take (all data cores together).
    #[arg(long = "tokenizer-cache-l1-max-memory", default_value_t = TOKENIZER_CACHE_L1_BYTES_DEFAULT)]
    pub cache_l1_max_memory: usize,
    /// Uncached prompt bytes a data core tokenizes itself; longer cold work goes to the
    /// tokenizer pool, so it does not stall the core's other connections.
    #[arg(long = "tokenizer-inline-max-bytes", hide = true, default_value_t = TOKENIZE_INLINE_BYTES_DEFAULT)]
    pub inline_max_bytes: usize,
}

/// One value of a path flag: the model it is for (`None`: every model) and the path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    /// The model name, or `None` for every model.
    pub model: Option<String>,
    /// The path.
    pub path: String,
}

impl ModelSpec {
    /// Reads `MODEL=PATH` or `PATH`. `is_path(value)` tells whether the whole value names an
    /// existing file (a path containing `=`), which then wins over the `MODEL=` reading.
    pub fn parse(value: &str, is_path: impl Fn(&str) -> bool) -> ModelSpec {
        if !is_path(value) {
            if let Some((model, path)) = value.split_once('=') {
                if !model.is_empty() && !path.is_empty() {
                    return ModelSpec {
                        model: Some(model.to_owned()),
                        path: path.to_owned(),
                    };
                }
            }
        }
        ModelSpec {
            model: None,
            path: value.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_name_a_model_unless_the_whole_value_is_a_path() {
        let never = |_: &str| false;
        assert_eq!(
            ModelSpec::parse("meta-llama/Llama-3.1-8B=/m/llama", never),
            ModelSpec {
                model: Some("meta-llama/Llama-3.1-8B".into()),
                path: "/m/llama".into()
            }
        );
        assert_eq!(ModelSpec::parse("/m/qwen", never).model, None);
        assert_eq!(ModelSpec::parse("=/m/qwen", never).path, "=/m/qwen");
        let exists = |v: &str| v == "/m/a=b";
        assert_eq!(ModelSpec::parse("/m/a=b", exists).model, None);
    }
}
