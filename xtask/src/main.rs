//! Developer tasks: `cargo xtask bench` (options: `cargo xtask bench --help`) and
//! `cargo xtask gpu-check` (docs/gpu.md).

mod alloc;
mod bench;
mod gpu_check;

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("bench") => bench::run(&args[1..]),
        Some("gpu-check") => std::process::exit(gpu_check::run(&args[1..]) as i32),
        #[cfg(feature = "flex")]
        Some("engine-all-reduce") => bench::engines::rank(&args[1..]),
        #[cfg(all(feature = "mpi", feature = "flex"))]
        Some("mpi-all-reduce") => bench::mpi::rank(&args[1..]),
        #[cfg(all(feature = "mpi", feature = "flex"))]
        Some("mpi-fsdp-traffic") => bench::traffic::mpi_rank(),
        _ => Err(format!("{}\n{}", bench::USAGE, gpu_check::USAGE)),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}
