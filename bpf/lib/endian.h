/* lib/endian.h: host <-> network byte order for constants, from the compiler's own notion of
 * the target's byte order (bpfel or bpfeb), never from an assumption about the host. */
#ifndef KPROXY_LIB_ENDIAN_H
#define KPROXY_LIB_ENDIAN_H

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define kp_htonl(x) ((__be32)(x))
#define kp_htons(x) ((__be16)(x))
#define kp_ntohs(x) ((__u16)(x))
#define kp_ntohl(x) ((__u32)(x))
#else
#define kp_htonl(x) ((__be32)__builtin_bswap32(x))
#define kp_htons(x) ((__be16)__builtin_bswap16(x))
#define kp_ntohs(x) ((__u16)__builtin_bswap16(x))
#define kp_ntohl(x) ((__u32)__builtin_bswap32(x))
#endif

#endif
