//! Developer tasks. `cargo xtask bench --help` for the benchmark's options.

mod alloc;
mod bench;

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("bench") => bench::run(&args[1..]),
        #[cfg(all(feature = "mpi", feature = "flex"))]
        Some("mpi-all-reduce") => bench::mpi::rank(&args[1..]),
        #[cfg(all(feature = "mpi", feature = "flex"))]
        Some("mpi-fsdp-traffic") => bench::traffic::mpi_rank(),
        _ => Err(bench::USAGE.to_string()),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}
