//! The classify phase: which endpoint a request targets and whether the gateway answers it
//! itself (`health`, `models`) or routes it to a worker. Unknown paths become 404, a known path
//! with the wrong method 405. The one [`Endpoint`] of the gateway: routing input extraction,
//! metrics labels and the data plane's dispatch all name endpoints with it.

/// The request methods the gateway distinguishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `GET`
    Get,
    /// `POST`
    Post,
    /// `HEAD`
    Head,
    /// Anything else (answered 404/405, never proxied).
    Other,
}

impl Method {
    /// The method's token (`OTHER` for the rest).
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Head => "HEAD",
            Method::Other => "OTHER",
        }
    }

    /// The method of a request line's method token.
    pub fn of_token(token: &str) -> Method {
        match token {
            "GET" => Method::Get,
            "POST" => Method::Post,
            "HEAD" => Method::Head,
            _ => Method::Other,
        }
    }
}

/// The endpoints the gateway knows. The discriminant indexes per-endpoint metric arrays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Endpoint {
    /// `POST /generate` (SGLang native).
    Generate,
    /// `POST /v1/chat/completions`.
    ChatCompletions,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/messages` (Anthropic shape).
    Messages,
    /// `GET /v1/models`, answered from the workers' model lists.
    Models,
    /// `GET /health`.
    Health,
    /// `GET /liveness`.
    Liveness,
    /// `GET /readiness`.
    Readiness,
    /// Anything else.
    Unknown,
}

/// What the gateway does with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handling {
    /// Route to a worker and stream its answer back.
    Proxy,
    /// Answer from the gateway itself.
    Local,
    /// Known path, wrong method: 405.
    WrongMethod,
    /// Unknown path: 404.
    NotFound,
}

impl Endpoint {
    /// Number of endpoints.
    pub const COUNT: usize = 9;

    /// Every endpoint, in discriminant order.
    pub const ALL: [Endpoint; Endpoint::COUNT] = [
        Endpoint::Generate,
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Messages,
        Endpoint::Models,
        Endpoint::Health,
        Endpoint::Liveness,
        Endpoint::Readiness,
        Endpoint::Unknown,
    ];

    /// The endpoint of a request path (query already removed).
    pub fn of_path(path: &[u8]) -> Endpoint {
        match path {
            b"/generate" => Endpoint::Generate,
            b"/v1/chat/completions" => Endpoint::ChatCompletions,
            b"/v1/completions" => Endpoint::Completions,
            b"/v1/messages" => Endpoint::Messages,
            b"/v1/models" => Endpoint::Models,
            b"/health" => Endpoint::Health,
            b"/liveness" => Endpoint::Liveness,
            b"/readiness" => Endpoint::Readiness,
            _ => Endpoint::Unknown,
        }
    }

    /// The metric label (`path`) of this endpoint.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Generate => "/generate",
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Messages => "/v1/messages",
            Endpoint::Models => "/v1/models",
            Endpoint::Health => "/health",
            Endpoint::Liveness => "/liveness",
            Endpoint::Readiness => "/readiness",
            Endpoint::Unknown => "other",
        }
    }

    /// Whether requests to this endpoint are routed to a worker (the inference APIs).
    pub fn is_routed(self) -> bool {
        matches!(
            self,
            Endpoint::Generate
                | Endpoint::ChatCompletions
                | Endpoint::Completions
                | Endpoint::Messages
        )
    }

    /// How a request with `method` to this endpoint is handled.
    pub fn handling(self, method: Method) -> Handling {
        let routed = self.is_routed();
        match (self, method) {
            (Endpoint::Unknown, _) => Handling::NotFound,
            (_, Method::Post) if routed => Handling::Proxy,
            (_, Method::Get | Method::Head) if !routed => Handling::Local,
            _ => Handling::WrongMethod,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_methods_classify() {
        assert_eq!(
            Endpoint::of_path(b"/v1/chat/completions"),
            Endpoint::ChatCompletions
        );
        assert_eq!(
            Endpoint::of_path(b"/v1/chat/completions/"),
            Endpoint::Unknown
        );
        assert_eq!(Endpoint::Generate.handling(Method::Post), Handling::Proxy);
        assert_eq!(
            Endpoint::Generate.handling(Method::Get),
            Handling::WrongMethod
        );
        assert_eq!(Endpoint::Models.handling(Method::Get), Handling::Local);
        assert_eq!(
            Endpoint::Health.handling(Method::Post),
            Handling::WrongMethod
        );
        assert_eq!(Endpoint::Unknown.handling(Method::Post), Handling::NotFound);
        for (i, e) in Endpoint::ALL.iter().enumerate() {
            assert_eq!(*e as usize, i);
            assert_eq!(Endpoint::of_path(e.label().as_bytes()), *e);
        }
        assert_eq!(Method::of_token("POST"), Method::Post);
        assert_eq!(Method::of_token("post"), Method::Other);
    }
}
