//! What every SOPA process (the host agent, the switch agent, each controller replica) shares
//! with the people and systems that run it: its logs, its HTTP endpoints (`/metrics`,
//! `/healthz`, `/readyz`) and who may reach them, its build info, its exit codes, and its
//! notifications to systemd.

pub mod allow;
pub mod build_info;
pub mod cert_expiry;
pub mod cli;
pub mod duration;
pub mod exit;
pub mod http;
pub mod logging;
pub mod notify;
pub mod tls;
