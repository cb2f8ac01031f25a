//! Every named maximum of the gateway (queues, buffers, pools, headers), each with the reason for
//! its value, and compile-time checks of how they relate.
