//! `sopa-agent doctor`: what this kernel has of what the agent uses, and what the agent does
//! where a feature is missing, before anything is attached.

use sopa_agent::{Error, netlink::Netlink, probe};

pub async fn doctor(json: bool) -> Result<(), Error> {
    let netlink = Netlink::connect()?;
    let (findings, verifier) = probe::findings(&netlink).await?;
    let version = probe::kernel_version()?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "kernel": version.to_string(),
                "features": findings,
                "verifier_error": verifier,
            }))
            .expect("findings serialize")
        );
    } else {
        println!("Linux {version}");
        print!("{}", probe::table(&findings));
        if let Some(why) = verifier {
            println!("the verifier: {why}");
        }
    }
    Ok(())
}
