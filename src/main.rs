fn main() {
    println!("cudastack");
}
