//! Integration tests of `pilotfish-xds`: the real ADS server on 127.0.0.1, driven by a
//! real tonic ADS client over a socket.

mod ads_delta;
mod ads_sotw;
mod harness;
