//! The HTTP/1.1 codec (on `httparse`), body limits, the upstream keep-alive pool and response
//! streaming.
