fn main() -> anyhow::Result<()> {
    let report = host::gpu::bench::run(0)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
