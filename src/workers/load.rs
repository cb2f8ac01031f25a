//! Load reports: `GET /v1/loads` (SGLang schema) or Prometheus `/metrics` (SGLang, vLLM names).
