fn main() {
    let args: Vec<String> = std::env::args().collect();
    let fds = protox::compile([&args[1]], [&args[2]]).expect("compile proto");
    let mut cfg = prost_build::Config::new();
    cfg.out_dir(&args[3]);
    cfg.bytes(["."]);
    cfg.compile_fds(fds).expect("generate");
}
