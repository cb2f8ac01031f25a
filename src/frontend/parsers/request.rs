//! A request's `tools` and `tool_choice`, OpenAI's and Anthropic's, and what they ask of the
//! engine: `required` and a named function constrain the output to a JSON array of calls (the
//! schema SGLang builds for them), parsed then as [`ToolFormat::Json`]; `auto` lets the model
//! write its own markup, parsed in its format; `none` parses nothing.

use serde_json::{json, Value};

use super::tools::ToolFormat;
use super::{ParseSetup, ParserFlags};
use crate::frontend::params::{Constraint, ParamError};

/// What the client allows the model to do with its tools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// No tool calls (the text is not parsed for them).
    None,
    /// The model chooses.
    Auto,
    /// At least one call (OpenAI's `required`, Anthropic's `any`).
    Required,
    /// A call of this function.
    Function(String),
}

/// A request's tools: their names and parameter schemas, and the choice.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolRequest {
    /// Each tool's name and parameters' JSON schema.
    tools: Vec<(String, Value)>,
    /// `tool_choice`.
    pub choice: ToolChoice,
}

impl ToolRequest {
    /// OpenAI's `tools` (`[{"type":"function","function":{"name","parameters"}}]`) and
    /// `tool_choice` (`"none"`, `"auto"`, `"required"`, `{"type":"function","function":
    /// {"name"}}`); `None` without tools.
    pub fn from_openai(
        tools: Option<&Value>,
        choice: Option<&Value>,
    ) -> Result<Option<ToolRequest>, ParamError> {
        let tools = tool_list(tools, "tools", |tool| {
            let function = tool.get("function").unwrap_or(tool);
            let name = function.get("name")?.as_str()?.to_owned();
            let schema = function.get("parameters").cloned().unwrap_or(json!({}));
            Some((name, schema))
        })?;
        let choice = match choice {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(match s.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                other => {
                    return Err(ParamError::field(
                        "tool_choice",
                        format!(
                        "tool_choice {other:?} is not one of none, auto, required, or a function"
                    ),
                    ))
                }
            }),
            Some(object) => {
                let name = object
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        ParamError::field("tool_choice", "tool_choice.function.name is required")
                    })?;
                Some(ToolChoice::Function(name.to_owned()))
            }
        };
        Self::checked(tools, choice)
    }

    /// Anthropic's `tools` (`[{"name","input_schema"}]`) and `tool_choice` (`{"type": "auto" |
    /// "any" | "tool" | "none", "name"}`); `None` without tools.
    pub fn from_anthropic(
        tools: Option<&Value>,
        choice: Option<&Value>,
    ) -> Result<Option<ToolRequest>, ParamError> {
        let tools = tool_list(tools, "tools", |tool| {
            let name = tool.get("name")?.as_str()?.to_owned();
            let schema = tool.get("input_schema").cloned().unwrap_or(json!({}));
            Some((name, schema))
        })?;
        let choice = match choice {
            None | Some(Value::Null) => None,
            Some(object) => {
                let kind = object.get("type").and_then(Value::as_str).unwrap_or("");
                Some(match kind {
                    "auto" => ToolChoice::Auto,
                    "any" => ToolChoice::Required,
                    "none" => ToolChoice::None,
                    "tool" => ToolChoice::Function(
                        object
                            .get("name")
                            .and_then(Value::as_str)
                            .ok_or_else(|| {
                                ParamError::field("tool_choice", "tool_choice.name is required")
                            })?
                            .to_owned(),
                    ),
                    other => {
                        return Err(ParamError::field(
                            "tool_choice",
                            format!(
                                "tool_choice.type {other:?} is not one of auto, any, tool, none"
                            ),
                        ))
                    }
                })
            }
        };
        Self::checked(tools, choice)
    }

    fn checked(
        tools: Vec<(String, Value)>,
        choice: Option<ToolChoice>,
    ) -> Result<Option<ToolRequest>, ParamError> {
        if tools.is_empty() {
            return match choice {
                None | Some(ToolChoice::None | ToolChoice::Auto) => Ok(None),
                Some(_) => Err(ParamError::field(
                    "tool_choice",
                    "tool_choice requires tools",
                )),
            };
        }
        let choice = choice.unwrap_or(ToolChoice::Auto);
        if let ToolChoice::Function(name) = &choice {
            if !tools.iter().any(|(n, _)| n == name) {
                return Err(ParamError::field(
                    "tool_choice",
                    format!("tool_choice names {name:?}, which is not among the tools"),
                ));
            }
        }
        Ok(Some(ToolRequest { tools, choice }))
    }

    /// Whether the output must be calls (`required` or a named function): constrained, and
    /// read as a JSON array of calls.
    pub fn forced(&self) -> bool {
        matches!(self.choice, ToolChoice::Required | ToolChoice::Function(_))
    }

    /// The engine's constraint for a forced choice: a JSON array of `{"name", "parameters"}`
    /// objects, one of the allowed functions each (SGLang's schema for the same choices).
    pub fn constraint(&self) -> Option<Constraint> {
        let one = |(name, schema): &(String, Value)| {
            json!({
                "properties": {
                    "name": {"type": "string", "enum": [name]},
                    "parameters": schema,
                },
                "required": ["name", "parameters"],
            })
        };
        let schema = match &self.choice {
            ToolChoice::Required => json!({
                "type": "array",
                "minItems": 1,
                "items": {"type": "object", "anyOf": self.tools.iter().map(one).collect::<Vec<_>>()},
            }),
            ToolChoice::Function(name) => {
                let tool = self.tools.iter().find(|(n, _)| n == name)?;
                json!({
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 1,
                    "items": {"type": "object", "anyOf": [one(tool)]},
                })
            }
            ToolChoice::None | ToolChoice::Auto => return None,
        };
        Some(Constraint::JsonSchema(schema.to_string()))
    }
}

fn tool_list(
    tools: Option<&Value>,
    field: &'static str,
    read: impl Fn(&Value) -> Option<(String, Value)>,
) -> Result<Vec<(String, Value)>, ParamError> {
    match tools {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) => list
            .iter()
            .map(|tool| {
                read(tool).ok_or_else(|| ParamError::field(field, "every tool needs a string name"))
            })
            .collect(),
        Some(_) => Err(ParamError::field(field, "tools must be an array")),
    }
}

impl ParserFlags {
    /// What a request for `model` with `tools` is parsed for.
    pub fn setup(&self, model: &str, tools: Option<&ToolRequest>) -> ParseSetup {
        let tools = match tools {
            Some(request) if request.forced() => Some(ToolFormat::Json),
            Some(request) if request.choice == ToolChoice::Auto => self.tool_for(model),
            _ => None,
        };
        ParseSetup {
            tools,
            reasoning: self.reasoning_for(model),
        }
    }
}
