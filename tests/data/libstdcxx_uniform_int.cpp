// Draws of libstdc++'s std::uniform_int_distribution<unsigned long> from std::mt19937 (default
// seed), then how many raw 32-bit outputs they consumed and the next raw output.
#include <cstdio>
#include <cstdlib>
#include <random>

struct Counting {
    using result_type = std::mt19937::result_type;
    std::mt19937 rng;
    unsigned long used = 0;
    static constexpr result_type min() { return std::mt19937::min(); }
    static constexpr result_type max() { return std::mt19937::max(); }
    result_type operator()() { ++used; return rng(); }
};

int main(int argc, char **argv) {
    unsigned long lo = std::strtoul(argv[1], nullptr, 10), hi = std::strtoul(argv[2], nullptr, 10);
    int n = std::atoi(argv[3]);
    Counting urng;
    std::uniform_int_distribution<unsigned long> dist(lo, hi);
    for (int i = 0; i < n; ++i) std::printf("%lu ", dist(urng));
    std::printf("\n%lu %lu\n", urng.used, (unsigned long)urng.rng());
    return 0;
}
