// libnftables, loaded on first use (common/lazy_lib.h) instead of at every start of sbx.
//
// Linked the usual way, libnftables.so.1 brings libnftnl, libxtables, libjansson and libgmp with
// it: five libraries loaded and relocated by every `sbx` invocation, though only a daemon with
// networking and `sbx run --net` ever touch the firewall (firewall.cc). So nothing links
// -lnftables: these are the functions firewall.cc calls, with <nftables/libnftables.h>'s
// prototypes. One missing here fails the link with an undefined reference: add it.
#include <nftables/libnftables.h>

#include "common/lazy_lib.h"

namespace {
constexpr char kLibnftables[] = "libnftables.so.1";
}  // namespace

#define SBX_LAZY(ret, name, params, args) SBX_LAZY_FROM(kLibnftables, ret, name, params, args)

// clang-format off
SBX_LAZY(nft_ctx*, nft_ctx_new, (uint32_t flags), (flags))
SBX_LAZY(void, nft_ctx_free, (nft_ctx* ctx), (ctx))
SBX_LAZY(void, nft_ctx_output_set_flags, (nft_ctx* ctx, unsigned int flags), (ctx, flags))
SBX_LAZY(int, nft_ctx_buffer_output, (nft_ctx* ctx), (ctx))
SBX_LAZY(const char*, nft_ctx_get_output_buffer, (nft_ctx* ctx), (ctx))
SBX_LAZY(int, nft_ctx_buffer_error, (nft_ctx* ctx), (ctx))
SBX_LAZY(const char*, nft_ctx_get_error_buffer, (nft_ctx* ctx), (ctx))
SBX_LAZY(int, nft_run_cmd_from_buffer, (nft_ctx* nft, const char* buf), (nft, buf))
// clang-format on
