//! Endpoint classification and extraction of the routing input (model, token IDs or text, cache
//! partition namespace) from a request head and body.
