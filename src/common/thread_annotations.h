// Clang's thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html) and
// the annotated Mutex and MutexLock they need: libstdc++'s std::mutex carries none, so a member
// marked GUARDED_BY(a std::mutex) could not be checked. Under gcc every macro is empty and Mutex
// is a std::mutex; `make thread-safety` compiles the annotated sources with clang
// -Wthread-safety -Werror.
//
//   class Cache {
//     Mutex mu_;
//     std::map<std::string, int> items_ GUARDED_BY(mu_);
//     void EvictLocked() REQUIRES(mu_);
//    public:
//     int Get(const std::string& k) EXCLUDES(mu_) { MutexLock lock(mu_); ... }
//   };
#pragma once

#include <mutex>

#if defined(__clang__)
#define SBX_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define SBX_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) SBX_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY SBX_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) SBX_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) SBX_THREAD_ANNOTATION(pt_guarded_by(x))
#define REQUIRES(...) SBX_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) SBX_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) SBX_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) SBX_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) SBX_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define RETURN_CAPABILITY(x) SBX_THREAD_ANNOTATION(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS SBX_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace sbx {

// A std::mutex the analysis knows as a capability. Also a BasicLockable, so std::unique_lock
// and std::condition_variable_any work with it (unchecked: prefer MutexLock).
class CAPABILITY("mutex") Mutex {
 public:
  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  std::mutex mu_;
};

// Holds a Mutex for its scope (std::lock_guard, annotated).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() RELEASE() { mu_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

}  // namespace sbx
