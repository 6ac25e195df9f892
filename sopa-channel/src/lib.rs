//! SOPA's push channel, shared by the agents and the controller: the messages (`proto`), the
//! agents' side of the stream (`client`), an agent's view of the fabric built from what the
//! controller sends (`view`), who a certificate speaks for (`identity`) and the agents' TLS
//! (`tls`). The controller's own code (its server, state, Hedera, certificate issuing) is not
//! here: an agent links only this.

pub mod client;
pub mod identity;
pub mod proto;
pub mod tls;
pub mod view;
