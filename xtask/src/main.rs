//! Developer tasks: `cargo xtask bench` (options: `cargo xtask bench --help`),
//! `cargo xtask gpu-check` (docs/gpu.md) and `cargo xtask equivalence` (docs/equivalence.md).

mod alloc;
mod bench;
#[cfg(feature = "flex")]
mod equivalence;
mod gpu_check;

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("bench") => bench::run(&args[1..]),
        Some("gpu-check") => std::process::exit(gpu_check::run(&args[1..]) as i32),
        #[cfg(feature = "flex")]
        Some("equivalence") => match equivalence::run(&args[1..]) {
            Ok(passed) => std::process::exit(if passed { 0 } else { 1 }),
            Err(e) => Err(e),
        },
        #[cfg(feature = "flex")]
        Some("engine-all-reduce") => bench::engines::rank(&args[1..]),
        #[cfg(all(feature = "mpi", feature = "flex"))]
        Some("mpi-all-reduce") => bench::mpi::rank(&args[1..]),
        #[cfg(feature = "flex")]
        Some("ring-vs-mpi") => bench::engines::print(&args[1..]),
        #[cfg(feature = "flex")]
        Some("ddp-overlap") => bench::overlap_processes::print(&args[1..]),
        #[cfg(feature = "flex")]
        Some("ddp-overlap-rank") => bench::overlap_processes::rank(&args[1..]),
        #[cfg(all(feature = "mpi", feature = "flex"))]
        Some("mpi-ddp-overlap-rank") => bench::overlap_processes::mpi_rank(&args[1..]),
        #[cfg(all(feature = "mpi", feature = "flex"))]
        Some("mpi-fsdp-traffic") => bench::traffic::mpi_rank(),
        _ => Err(usage()),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}

/// Every command's usage.
fn usage() -> String {
    let mut usage = format!("{}\n{}", bench::USAGE, gpu_check::USAGE);
    #[cfg(feature = "flex")]
    usage.push_str(&format!("\n{}", equivalence::USAGE));
    #[cfg(feature = "flex")]
    usage.push_str(
        "\ncargo xtask ddp-overlap [STEPS]: DDP's overlap between 2 processes on the real \
         engines (ring; MPI with --features mpi)",
    );
    usage
}
