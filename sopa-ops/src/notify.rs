//! Notifications to systemd for `Type=notify` units: ready once serving, reloading while a
//! SIGHUP is applied, stopping on the way out. Outside systemd (no `NOTIFY_SOCKET`) each is a
//! no-op.

use sd_notify::NotifyState;
use tracing::debug;

fn send(states: &[NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(err) = sd_notify::notify(states) {
        debug!(%err, "notifying systemd");
    }
}

/// Up and serving, with a status line for `systemctl status`.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// A reload (SIGHUP) has begun; [`ready`] ends it. systemd wants the monotonic time with it
/// (`Type=notify-reload`, and `systemctl reload` of a `Type=notify` unit since 253).
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

/// On the way out.
pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

/// A status line for `systemctl status` (a standby replica waiting for the leadership).
pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}
