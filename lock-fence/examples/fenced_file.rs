//! Fenced file writes: a report replaced, and a log appended, only under a
//! token not below the last one that wrote them (kept in `FILE.fence`).
//! Runs with no server:
//!
//!     cargo run -p lock-fence --example fenced_file

use lock_fence::{FencingToken, file};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let report = dir.path().join("report.txt");
    let log = dir.path().join("job.log");

    file::replace(&report, FencingToken::new(7), b"from run 7\n".to_vec()).await?;
    file::append(&log, FencingToken::new(7), b"run 7 done\n".to_vec()).await?;

    // A run that held token 6 and lost its lock wakes up late.
    let late = file::replace(&report, FencingToken::new(6), b"from run 6\n".to_vec()).await;
    match late {
        Err(err) if err.is_stale() => println!("refused: {err}"),
        other => panic!("a stale token must not write: {other:?}"),
    }
    println!("report: {}", std::fs::read_to_string(&report)?.trim());
    println!("last token: {:?}", file::current(&report)?);
    Ok(())
}
