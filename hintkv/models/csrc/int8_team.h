// The table int8_cpu's build hands decode_team.cpp by address (int8_cpu.team_address()): ONE declaration, prepended
// to both builds' source (int8_cpu.py's _SOURCE, decode_layers.py's source()). prepare(x, inv_smooth, M, K, levels,
// Kq, depth, q, a, s) quantizes a linear's input rows; blocks(a, M, levels, Kq, depth, wb, s, w_comp, w_scale, N, y,
// ldy, n0, n1) writes its output channels [n0, n1). depth: the blocked weight's last dim (4: int8 quads, `levels`
// int8 rows a token; 2: int16_gemv.cpp's pairs, one 14-bit row a token). The table crosses two .so files as a bare
// int64, so it carries `abi`, checked by decode_team() before any call: bump INT8_TEAM_ABI with any change to this
// struct or its signatures.
constexpr int64_t INT8_TEAM_ABI = 3;

struct Int8Team {
    int64_t abi;
    void (*prepare)(const float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int8_t*, int32_t*, float*);
    void (*blocks)(const int32_t*, int64_t, int64_t, int64_t, int64_t, const int8_t*, const float*, const int32_t*,
                   const float*, int64_t, float*, int64_t, int64_t, int64_t);
};
