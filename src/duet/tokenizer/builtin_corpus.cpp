// Text written for duet to train the vocabularies of synthetic test models. Nothing here is
// taken from elsewhere; it only has to look enough like real prompts (prose, code, numbers,
// punctuation, some non-ASCII) for BPE to learn useful merges. Code and data are in
// builtin_corpus_code.cpp.
#include <string>

#include "duet/tokenizer/bpe_trainer.h"
#include "duet/tokenizer/builtin_corpus_parts.h"

namespace duet {
namespace {

constexpr std::string_view kProse = R"txt(A computer is a machine that follows instructions very quickly and never gets bored. The instructions live in memory next to the data they work on, and the processor fetches them one after another, decodes each one, and carries it out. Everything else, from the operating system to the web browser, is built on top of that simple loop.

Memory is arranged in a hierarchy. Registers sit inside the processor and can be read in a single cycle. Next come the caches: a small first-level cache, a larger second-level cache, and often a shared third-level cache. Main memory is much bigger and much slower, and storage on a disk or a solid-state drive is slower still. A program that touches memory in a predictable order lets the hardware fetch the next cache line before it is needed, which is why walking an array from start to end is usually faster than chasing pointers through a linked list.

A compiler translates source code into machine code. It first reads the text and breaks it into tokens, then builds a syntax tree, checks the types, and lowers the tree into an intermediate representation. Most of the interesting work happens on that representation: constant folding, inlining, loop unrolling, vectorization, and register allocation. The last stage chooses real instructions for the target processor and writes an object file that the linker later combines with other object files into an executable.

Operating systems share one machine among many programs. The scheduler decides which thread runs on which core and for how long. Virtual memory gives every process the illusion of a private address space, while the kernel maps pages to physical frames and swaps them out when memory runs short. System calls are the narrow door through which a program asks the kernel to open a file, send a packet, or start another process.

Networks move bytes between machines. A packet travels from an application through the transport layer, where TCP adds sequence numbers and retransmits what was lost, down to the network layer, where IP chooses a route, and finally onto a link such as Ethernet or Wi-Fi. Latency is the time a single message takes to arrive; bandwidth is how many bytes per second the link can carry. Good protocols are designed around both: they batch small messages to save round trips and stream large transfers to keep the pipe full.

Language models read text as a sequence of tokens. A tokenizer splits the input into pieces that appear often in the training data, so a common word becomes a single token while a rare word is spelled out from smaller parts. Byte pair encoding builds such a vocabulary by starting from single bytes and repeatedly merging the most frequent adjacent pair. Because every byte is in the vocabulary, any input can be encoded, even text in a script the tokenizer has never seen.

When a model generates text, it produces one token at a time. Each step reads the whole context through the attention layers, but the keys and values of earlier tokens do not change, so a server keeps them in a cache and only computes the newest position. Serving many users at once means packing their requests into batches, reusing cached prefixes when two prompts start the same way, and streaming each finished token back as soon as it is decoded. The hard part is keeping the accelerator busy without letting any single request wait too long.

Testing is how engineers find out that their code does what they think it does. A unit test checks one small piece in isolation; an integration test checks that several pieces work together; a benchmark measures how fast something runs. The best tests are fast, deterministic, and precise about what went wrong: instead of saying that two results differ, they say which element differs, what was expected, and what was found.

Floating-point numbers trade exactness for range. A 32-bit float has a sign bit, eight exponent bits and twenty-three fraction bits, which gives about seven decimal digits of precision. Half-precision formats keep only ten fraction bits, and bfloat16 keeps the exponent of a full float but only seven fraction bits. Quantized formats go further: they store small integers together with a scale for each block of values, so that a large weight matrix fits in a fraction of the memory.

Concurrency is hard because the order of events is no longer fixed. Two threads that update the same counter without a lock can both read the old value and both write the same new value, losing one of the updates. Locks, atomic operations and message queues each solve part of the problem. A useful rule is to share as little as possible: give each thread its own data, and let them meet only in a few well-defined places.

Databases keep data safe and let many clients read and change it at the same time. An index is a sorted structure, often a B-tree, that lets the database find a row without scanning the whole table. Transactions group several changes so that either all of them happen or none of them do. A write-ahead log records every change before it is applied, so that after a crash the database can replay the log and return to a consistent state.

Version control remembers every change to a project. Each commit records a snapshot of the files, the name of its author, a message that explains why the change was made, and a pointer to its parent. Branches let several people work on different features at once, and merging brings their work back together. A good commit message is short in its first line and explains the reasoning in the body, because the code already shows what changed.
)txt";

constexpr std::string_view kWorld = R"txt(English: The quick brown fox jumps over the lazy dog while the compiler finishes the build.
Deutsch: Größere Modelle benötigen mehr Speicher, aber die Qualität der Antworten steigt. Schöne Grüße aus Köln!
Français : Le modèle répond à la question en français ; il écrit « bonjour » et « merci » sans hésiter. Où est la gare ?
Español: El servidor procesa muchas peticiones a la vez; ¿cuántos tokens por segundo genera? ¡Muchísimos!
Português: A memória do computador é organizada em níveis, e o cache é o mais rápido de todos.
Italiano: La città è bella, il caffè è forte e la pizza è già pronta.
Polski: Zażółć gęślą jaźń. Tłumaczenie maszynowe działa coraz lepiej.
Čeština: Příliš žluťoučký kůň úpěl ďábelské ódy.
Türkçe: Bilgisayar çok hızlı çalışıyor ve öğrenciler şaşırıyor.
Русский: Быстрая коричневая лиса перепрыгивает через ленивую собаку. Компьютер выполняет программу.
Українська: Швидкий сервер обробляє запити користувачів.
Ελληνικά: Ο υπολογιστής εκτελεί εντολές πολύ γρήγορα. Καλημέρα κόσμε!
עברית: שלום עולם, המחשב עובד מהר.
العربية: مرحبا بالعالم، الحاسوب يعمل بسرعة.
हिन्दी: नमस्ते दुनिया, कंप्यूटर तेज़ी से काम करता है।
中文：你好，世界！计算机按照指令运行程序。语言模型把文本切分成词元，然后逐个生成新的词元。服务器同时处理很多请求。
日本語：こんにちは、世界。コンピューターは命令を順番に実行します。トークナイザーは文章を小さな単位に分けます。
한국어: 안녕하세요, 세계! 컴퓨터는 명령을 매우 빠르게 실행합니다. 토크나이저는 문장을 작은 조각으로 나눕니다.
ไทย: สวัสดีชาวโลก คอมพิวเตอร์ทำงานเร็วมาก
Tiếng Việt: Xin chào thế giới, máy tính chạy rất nhanh.
Emoji: 😀 😃 🚀 🎉 👍🏽 ❤️ 🔥 ✅ ❌ ⚠️ 🧪 🖥️ 👩‍💻 🇩🇪 🇯🇵 — mixed with text 🙂 and numbers 123.
Full-width: ＡＢＣ ａｂｃ １２３ （括弧） 「引用」 『二重』 【強調】 ！？。、
)txt";

constexpr std::string_view kMore = R"txt(Q: What does a cache do?
A: It keeps recently used data close to the processor, so the next access is fast. If the data is not there, that is a miss, and the processor waits for main memory.

Q: Why do language models need a tokenizer?
A: The network works on numbers, not characters. The tokenizer maps text to token ids and back, and a good vocabulary keeps sequences short without making the embedding table too large.

Q: What is the difference between a process and a thread?
A: A process owns an address space and resources such as open files. A thread is a path of execution inside a process; threads of one process share its memory.

Q: How do you make a program faster?
A: Measure first. Find where the time goes, then improve that part: use a better algorithm, touch less memory, avoid needless copies, and only then reach for parallelism or hand-written vector code.

Step 1. Read the input file line by line.
Step 2. Split each line into fields separated by commas.
Step 3. Convert the numeric fields and skip rows that fail to parse.
Step 4. Sum the values per key and print the totals in descending order.

TODO: handle empty lines; FIXME: the parser rejects quoted commas; NOTE: times are in milliseconds.
Error: expected 3 fields, found 2 at line 17 of "data/input.csv".
Warning: the cache is 93% full; evicting 128 blocks.

SELECT name, COUNT(*) AS n FROM requests WHERE status = 'done' GROUP BY name ORDER BY n DESC LIMIT 10;
CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL, created_at TIMESTAMP);

for (int i = 0; i < n; i++) { sum += a[i] * b[i]; }
while (left < right) { int mid = left + (right - left) / 2; if (a[mid] < x) left = mid + 1; else right = mid; }
if (ptr == nullptr) { return Error::kNotFound; } else if (size > limit) { return Error::kTooLarge; }

def fib(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a

print([fib(i) for i in range(15)])  # [0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377]

fn main() {
    let words = vec!["alpha", "beta", "gamma"];
    for (i, w) in words.iter().enumerate() {
        println!("{}: {}", i, w);
    }
}

func handler(w http.ResponseWriter, r *http.Request) {
    fmt.Fprintf(w, "hello, %s\n", r.URL.Path[1:])
}

const sum = (xs) => xs.reduce((a, b) => a + b, 0);
console.log(sum([1, 2, 3, 4, 5]));  // 15

<html><head><title>Status</title></head><body><p class="ok">All systems normal.</p></body></html>

The model was trained on a mixture of prose, code and dialogue. It learned that "the" is common, that "ing" often ends a word, and that four spaces usually start an indented line of Python. It also learned that numbers are best kept short, so that 2024 and 1999 are read in small pieces rather than as single rare tokens.

Small models are useful for testing. Their weights are random, so their answers are nonsense, but every layer still runs and every shape still has to match. A test that compares the output of two implementations on the same random model will catch almost any mistake in the wiring: a transposed matrix, a missing scale, a wrong offset in the cache, or a token that was fed twice.
)txt";

constexpr std::string_view kProse2 = R"txt(Graphics processors were built to color millions of pixels at once, and that same design turned out to be ideal for the arithmetic of neural networks. A GPU has thousands of small cores grouped into streaming multiprocessors. Threads are launched in blocks, and the threads of a block can share a fast scratchpad memory and wait for one another at a barrier. Within a block, threads run in groups of thirty-two called warps, and all threads of a warp execute the same instruction at the same time. When the threads of a warp take different branches, the hardware runs both paths one after the other, so divergent code wastes much of the machine.

The fastest kernels keep data on the chip for as long as possible. A matrix multiplication loads a tile of each input into shared memory, multiplies the tiles with tensor cores, accumulates the partial results in registers, and only writes the finished tile back to global memory. The ratio between arithmetic and memory traffic decides whether a kernel is compute bound or memory bound. Decoding one token at a time is memory bound: every weight has to be read for a handful of multiplications, so the speed is set by memory bandwidth, not by the number of cores.

A file system turns a flat array of disk blocks into files and directories. It keeps an inode for every file, with its size, its owner, its permissions and the list of blocks that hold its data. Directories are files too; they map names to inode numbers. Journaling file systems write their metadata changes to a log before applying them, so that a crash in the middle of an update never leaves the structure half written. Modern file systems also keep checksums, take cheap snapshots, and copy data only when it is modified.

Security starts with a clear idea of what you are protecting and from whom. Passwords should never be stored as they are; a server stores a slow, salted hash instead, so that a stolen database does not reveal them. Encryption protects data in transit and at rest: a symmetric cipher such as AES encrypts the bulk of the data, and public-key cryptography is used to agree on the secret key. A signature proves that a message came from the holder of a private key and was not changed on the way. Most attacks, however, do not break the mathematics; they exploit a missing check, an injected command, a leaked key, or a user who clicked the wrong link.

Distributed systems are collections of computers that pretend to be one. Messages can be delayed, reordered, duplicated or lost, and any machine can stop at any moment. Consensus protocols such as Paxos and Raft let a group of servers agree on a sequence of commands even when some of them fail, as long as a majority is still running. Replication keeps copies of the data on several machines, and partitioning splits the data so that no single machine has to hold all of it. The famous trade-off says that during a network partition a system must choose between staying available and staying consistent.

An algorithm is a precise recipe for solving a problem, and its complexity tells us how its cost grows with the size of the input. Binary search finds an item in a sorted array of a million elements in about twenty steps, because each step halves the remaining range. Sorting takes on the order of n log n comparisons. Some problems have no known fast algorithm at all: for the traveling salesman, the best exact methods still take time that grows exponentially with the number of cities, so in practice we accept a good tour instead of the best one.

Data structures are the shapes in which we keep information so that the operations we need are cheap. An array gives constant-time access by index. A hash table gives expected constant-time lookup by key, as long as the hash function spreads the keys well and the table is not too full. A balanced search tree keeps its keys in order and supports lookups, insertions and range queries in logarithmic time. A heap always knows its smallest element, which makes it the natural choice for a priority queue. A trie stores strings by their prefixes, which is handy for autocomplete and for matching many patterns at once.

Every large program eventually needs logging. A good log line says when something happened, where it happened, and what the values were: the request id, the file name, the size that was expected and the size that was found. Logs should be structured enough for a machine to search and plain enough for a person to read at three in the morning. Too little logging leaves you guessing; too much buries the one line that matters and slows the program down.

Caching appears at every level of a computer. The processor caches memory, the operating system caches file pages, the browser caches images, and a content delivery network caches whole web sites close to their readers. The two hard questions are always the same: what to keep when space runs out, and how to notice that a cached copy is no longer correct. Least-recently-used eviction is a good default because recent use is a decent predictor of future use.

Compilers and interpreters are two answers to the same question. An interpreter reads the program and carries it out step by step, which makes it easy to start and easy to debug. A compiler translates the whole program ahead of time, which takes longer but produces faster code. Just-in-time compilers combine the two: they start by interpreting, watch which functions run most often, and compile those to machine code while the program is running.

The history of computing is a story of layers. Early programmers toggled switches and fed punched cards into machines that filled whole rooms. Assembly language gave names to the instructions, and high-level languages let people describe what they wanted instead of which registers to use. Operating systems hid the hardware behind files and processes, networks connected the machines, and the web connected the people. Each layer made the one below it invisible to most programmers, and each new layer was built by people who still understood the old ones.

A good engineer reads error messages carefully. The message usually says exactly what went wrong, and the first error is more important than the hundred that follow it. When the message is not enough, the next step is to make the problem smaller: remove everything that is not needed to reproduce it, until what is left is so simple that the cause becomes obvious. Most bugs are found this way, not by staring at the code.

Performance work follows a simple loop: measure, find the biggest cost, reduce it, and measure again. Intuition is a poor guide, because modern machines are full of caches, pipelines and predictors that make the slow part hard to guess. A profiler shows where the time goes. A micro-benchmark isolates one function, but it can lie if the data it uses fits in a cache that the real workload would miss. The only benchmark that really counts is the one that looks like production.

Open standards let programs written by different people work together. A file format describes exactly how the bytes are laid out: a magic number at the start, a version, a header with sizes and offsets, and then the data, aligned so that it can be mapped straight into memory. A protocol describes the messages two programs exchange and what each one must do when it receives them. The best specifications are short, precise, and come with test files that every implementation must read correctly.
)txt";

constexpr std::string_view kDialogue = R"txt(User: Can you explain what a tokenizer does, in simple words?
Assistant: Sure. A tokenizer cuts text into small pieces called tokens and gives each piece a number. The model only ever sees those numbers. When it answers, it produces numbers again, and the tokenizer turns them back into text.

User: Why not just use letters?
Assistant: You could, but the sequences would be very long, and the model would spend most of its effort learning how to spell. Whole words have the opposite problem: there are too many of them, and new words appear all the time. Subword tokens are a compromise. Common words get their own token, and rare words are built from a few pieces.

User: What happens with emoji or Chinese characters?
Assistant: A byte-level tokenizer can always fall back to the raw bytes of the character. Each emoji is four bytes in UTF-8, so in the worst case it becomes four tokens. Frequent characters usually get tokens of their own during training.

User: How do I count the tokens in my prompt?
Assistant: Run the same tokenizer that the model uses and look at the length of the result. Different models use different vocabularies, so the same text can have a different number of tokens for each of them.

User: My program crashes with "segmentation fault". What does that mean?
Assistant: The program tried to read or write memory that it does not own. Common causes are a null pointer, an index past the end of an array, or using memory after it was freed. Run it under a debugger or with the address sanitizer, and it will usually point at the exact line.

User: Thanks! One more question: what is the difference between latency and throughput?
Assistant: Latency is how long one request takes from start to finish. Throughput is how many requests the system completes per second. A server can have high throughput and still feel slow if each request waits a long time in a queue, so you usually watch both.

User: Write a haiku about compilers.
Assistant: Tokens become trees, / trees descend to instructions, / the loop runs at dawn.

User: Please summarize the last paragraph in one sentence.
Assistant: The paragraph says that a server should be judged both by how fast each request finishes and by how many requests it finishes per second.

User: How do I reverse a list in Python?
Assistant: Use slicing, items[::-1], to get a reversed copy, or call items.reverse() to reverse the list in place.

User: And in C++?
Assistant: Call std::reverse(v.begin(), v.end()) from the algorithm header, or iterate with v.rbegin() and v.rend() if you only need to read it backwards.
)txt";

constexpr std::string_view kStory = R"txt(The night before the release, Mara found the bug. The service had passed every test for a week, but one request in ten thousand came back with a single wrong character at the very end of the answer. It was always the last character, and it was always a question mark in a box.

She pulled the logs for one of the bad requests. The model had produced the right tokens; she could see them in the trace. The text that reached the client, however, stopped one byte short. The last token of the answer was the second half of a Japanese character, and the streaming code had flushed the buffer just before it arrived.

"We never wait for the rest of a character," she wrote to the team. "If a token ends in the middle of one, we print what we have and the client replaces it with the replacement symbol." Nobody had noticed in English, where every character is a single byte. In Japanese and Chinese, and in any message with emoji, the bug was waiting.

The fix was small. The detokenizer now keeps back any bytes that form the beginning of a character and releases them only when the character is complete. When the stream ends, whatever is still held back is replaced, on purpose, by the replacement symbol, so that the client never receives broken text. Mara added a test that splits every emoji in a long string across two tokens, and another that feeds random bytes through the stream and checks that every piece is valid.

The release went out the next morning. In the notes, under "fixed", there was one line: streaming no longer cuts multi-byte characters in half.

A week later, the same team met a different problem. A customer reported that the server became slow whenever someone pasted a long document into the chat. The profile showed that almost all of the time went into the tokenizer, which was matching a regular expression against the whole document again and again. They changed the code so that each piece of text was matched exactly once, compiled the expression with the just-in-time compiler, and reused the match buffer between calls. The same document that had taken two seconds now took a few milliseconds.

"The lesson," said Mara at the retrospective, "is that the boring parts matter. Nobody looks at the tokenizer until it is wrong or slow, and then it is the only thing anyone looks at."
)txt";

constexpr std::string_view kProse3 = R"txt(How a request travels through an inference server

When a client sends a prompt, the first thing the server does is check that the request makes sense: the model name exists, the number of tokens to generate is positive, the temperature is not negative, and the body is valid JSON. A request that fails these checks is answered at once with an error that names the field and explains what was wrong. Only a valid request is turned into tokens and handed to the engine.

The engine keeps two lists: the requests that are running and the requests that are waiting. At every step the scheduler looks at both lists and decides what fits. Each running request needs room in the cache for one more token; each waiting request needs room for its whole prompt, or at least for the next chunk of it. If the cache is full, the scheduler may pause a running request, free its blocks, and bring it back later. This is called preemption, and it is the reason a busy server can keep accepting work without running out of memory.

Prompts that share a beginning can share cache blocks. A chat application sends the same system message with every conversation, so the keys and values for that message can be computed once and reused. The server hashes each full block of tokens together with the hash of the block before it, and looks the hash up in a table of cached blocks. On a hit it compares the tokens as well, because two different texts could in principle produce the same hash, and a wrong answer is much worse than a slow one.

After the forward pass, the sampler turns the logits of each request into its next token. Greedy decoding takes the most likely token. Sampling with a temperature divides the logits by the temperature first, so that a low temperature makes the choice almost greedy and a high one makes it more adventurous. Top-k keeps only the k most likely tokens, and top-p keeps the smallest set whose probabilities add up to p. Penalties for repetition lower the scores of tokens that have already appeared.

The new token goes to the detokenizer, which turns it into text without cutting a character in half, and then to the stop checks. Generation ends when the model produces an end-of-sequence token, when the text contains one of the stop strings, when the maximum number of tokens is reached, or when the client goes away. Whatever the reason, the server records it, frees the blocks that no other request uses, and sends the final message.

Training a language model

Training starts with data: a large collection of text, cleaned, deduplicated and mixed from many sources. The tokenizer is trained first, on a sample of that text, and then every document is converted to token ids once and stored. During training the model reads batches of token sequences and learns to predict each next token from the ones before it. The error of each prediction is measured with cross-entropy, and the gradient of that error tells every weight which way to move.

Large models are trained on many accelerators at once. Data parallelism gives each device a different slice of the batch and averages the gradients. Tensor parallelism splits each large matrix across devices, and pipeline parallelism gives each device a different group of layers. Mixture-of-experts models add another dimension: each token is routed to a few expert networks out of many, so the model can have a huge number of parameters while each token only uses a small part of them.

After pre-training, the model is tuned to follow instructions and to hold a conversation. It sees examples of questions and good answers, and later it may be trained further with feedback on which of two answers people prefer. The chat template decides how a conversation is written as text: where the system message goes, how the turns of the user and the assistant are marked, and which special token ends each turn. A server must render the template exactly as the model saw it in training, or the answers get worse in ways that are hard to notice.

Memory and bandwidth

Most of the time spent generating text goes into moving weights from memory to the processor. A model with seven billion parameters stored in sixteen-bit floats takes fourteen gigabytes, and every generated token has to read all of them. With a memory bandwidth of one terabyte per second, that sets a limit of about seventy tokens per second for a single request, no matter how fast the arithmetic units are. Batching helps because the weights are read once for the whole batch, and quantization helps because smaller weights take less time to read.

The cache grows with every token. Each layer stores a key and a value vector for each position, for each attention head. Grouped-query attention shares the keys and values between several query heads, and multi-head latent attention compresses them into a small latent vector that is expanded when needed. Both tricks shrink the cache, which lets the server keep more requests running at once and handle longer contexts.

On a machine without a large accelerator, the processor does all the work. Its cores have vector units that process eight or sixteen numbers per instruction, and its caches are large enough to hold a good part of a small model. The layers can be split between the accelerator and the processor: the attention layers, which need the cache, run on the accelerator, while the expert layers of a mixture-of-experts model, which are large but rarely used, stay in the main memory of the host.

Writing documentation

Good documentation answers the questions a reader actually has, in the order they have them. What is this? How do I install it? How do I run the simplest example? What are the options? What do the error messages mean? A short example that can be copied and run is worth more than a page of description. Reference documentation lists every option with its type, its default value and its effect, and says what happens at the edges: an empty input, a negative number, a file that does not exist.

Documentation rots when the code changes and the text does not. The best defense is to keep the two close: a comment next to the function it describes, an example that is also a test, a design note in the same commit as the change it explains. When a reader finds a mistake, fixing it should take minutes, not a week of permissions.

Reviewing code

A code review is a conversation about a change before it becomes part of the project. The reviewer checks that the change does what it says, that it is tested, that the names are clear, and that the next person to read the code will understand it. Good reviews are specific and kind: they point at a line, explain the concern, and suggest a way forward. Small changes get better reviews than large ones, because a reviewer can hold a small change in their head.

The author helps by describing the change well. The description says what changed and why, how it was tested, and what the reviewer should look at most carefully. A change that mixes a refactoring with a new feature is hard to review; two separate changes are easier for everyone.
)txt";

constexpr std::string_view kFaq = R"txt(Frequently asked questions

How much memory do I need to run a model?
Roughly the size of the weights plus the cache. A model with eight billion parameters quantized to four bits needs about five gigabytes for its weights. The cache needs a few hundred kilobytes per token for a model of that size, so a context of eight thousand tokens adds a gigabyte or two.

Why is the first token slower than the others?
The first token needs the whole prompt to be processed. That prefill step is usually faster per token than generation, because it can use large matrix multiplications, but a long prompt still takes a noticeable time. The time to first token grows with the length of the prompt.

Can I run two models at once?
Yes, as long as both fit in memory. Each model gets its own engine and its own cache, and the server routes each request by the model name it asks for.

What does "context length exceeded" mean?
The prompt and the requested number of new tokens together are longer than the model can handle. Shorten the prompt, ask for fewer tokens, or use a model with a longer context.

Why do I get different answers for the same prompt?
Sampling is random unless the temperature is zero or a fixed seed is given. Even with greedy decoding, batching can change the order of floating-point additions, which can change the last digits of the logits and, rarely, the chosen token.

How do I stop the model at a certain word?
Pass a list of stop strings. The server checks the generated text after every token and ends the request as soon as one of them appears. The stop string itself is not included in the answer.

Is the API compatible with other clients?
The server follows the widely used chat completions format, so most client libraries work if you point them at the server's address. Streaming responses use server-sent events, one event per chunk, and end with a final event that says done.

What happens when a client disconnects?
The server notices on its next write, cancels the request, and frees its cache blocks. Other requests are not affected.

Where are the logs?
By default they go to standard error. Set the log level to debug to see every scheduling decision, or to warn to see only problems.

How do I report a bug?
Include the exact command you ran, the model file, the full error message, and, if you can, the smallest prompt that shows the problem. A bug that can be reproduced is usually fixed quickly.
)txt";

constexpr std::string_view kWorld2 = R"txt(Deutsch: Der Server verarbeitet viele Anfragen gleichzeitig. Jede Anfrage wird in Tokens zerlegt, und das Modell erzeugt die Antwort Token für Token. Wenn der Speicher knapp wird, pausiert der Planer eine Anfrage und setzt sie später fort.
Français : Le serveur traite plusieurs requêtes à la fois. Chaque requête est découpée en jetons, puis le modèle génère la réponse jeton après jeton. Quand la mémoire manque, l'ordonnanceur met une requête en pause et la reprend plus tard.
Español: El servidor atiende muchas solicitudes al mismo tiempo. Cada solicitud se divide en tokens y el modelo genera la respuesta token a token. Cuando falta memoria, el planificador pausa una solicitud y la reanuda después.
Italiano: Il server gestisce molte richieste contemporaneamente e il modello genera la risposta un token alla volta.
Nederlands: De server verwerkt veel verzoeken tegelijk en het model maakt het antwoord token voor token.
Svenska: Servern hanterar många förfrågningar samtidigt, och modellen skriver svaret en token i taget.
Русский: Сервер обрабатывает много запросов одновременно. Каждый запрос разбивается на токены, и модель генерирует ответ токен за токеном. Когда памяти не хватает, планировщик приостанавливает запрос и возобновляет его позже.
中文：服务器同时处理许多请求。每个请求先被切分成词元，然后模型一个词元一个词元地生成回答。当显存不足时，调度器会暂停一个请求，稍后再继续。缓存可以在前缀相同的请求之间共享。
日本語：サーバーは多くのリクエストを同時に処理します。各リクエストはトークンに分割され、モデルはトークンを一つずつ生成して回答を作ります。メモリが足りないときは、スケジューラーがリクエストを一時停止し、後で再開します。
한국어: 서버는 많은 요청을 동시에 처리합니다. 각 요청은 토큰으로 나뉘고, 모델은 토큰을 하나씩 생성하여 답을 만듭니다.
)txt";

constexpr std::string_view kProse4 = R"txt(A tutorial: building a small web service

In this tutorial we build a service that counts words. It accepts a piece of text over HTTP, counts how often each word appears, and returns the ten most common words as JSON. Along the way we look at request parsing, error handling, testing, and measuring performance.

First, decide what the interface looks like. The client sends a POST request to the path /count with a JSON body that has one field, text. The service answers with a JSON object that has a field called words, a list of pairs of a word and its count, sorted by count and then alphabetically. If the body is not valid JSON, or the field is missing, or the text is longer than one megabyte, the service answers with status 400 and a message that says which of these went wrong.

Second, write the counting function and test it on its own, without any networking. Split the text on whitespace, strip punctuation from both ends of each word, convert it to lower case, and count. Test it with an empty string, a string with one word, a string where two words have the same count, and a string with punctuation and capital letters. These tests run in a millisecond and catch most mistakes before a single socket is opened.

Third, add the HTTP layer. Use an existing library rather than parsing requests by hand; the format has many corners that are easy to get wrong. Keep the handler short: parse the body, validate it, call the counting function, and serialize the result. Every error path should produce the same shape of response, so that clients can handle errors in one place.

Fourth, test the whole service. Start it on a free port of the local machine, send real requests with a real client, and check both the status codes and the bodies. Include the error cases: a body that is not JSON, a missing field, a text that is too long, and a request to a path that does not exist. A test that starts the real binary catches mistakes in configuration and startup that unit tests never see.

Fifth, measure. Send a thousand requests with a text of a few kilobytes each, first one at a time and then from many clients at once, and record the latency of every request. Look at the median and the slowest one percent, not only at the average. If the slowest requests are much slower than the median, find out why before optimizing anything else: the cause is often a lock that everyone waits for, or a garbage collector, or a log line that writes to a slow disk.

Finally, document what you built: how to run it, what the endpoint expects, what it returns, and what each error means. Add an example request that the reader can paste into a terminal. When someone else runs the service for the first time, that example will be the first thing they try.

How processors execute instructions

A modern processor does not run one instruction at a time. It fetches several instructions per cycle, decodes them into simpler operations, and places them in a window where they wait until their inputs are ready. Operations whose inputs are ready run out of order on whichever execution unit is free, and a reorder buffer makes sure that their results become visible in the original program order. This is how a processor keeps its units busy even when one instruction is waiting for memory.

Branches are a problem for such a machine, because it does not know which instructions come next until the branch is resolved. A branch predictor guesses, based on the history of that branch and of the branches before it, and the processor runs ahead speculatively. A correct guess costs nothing; a wrong one throws away the speculative work and costs a dozen cycles or more. Loops with predictable branches run fast, and code that branches on random data runs slowly, which is why sorting an array before processing it can make a loop several times faster.

Vector instructions process several numbers with a single instruction. With 256-bit registers, one instruction adds eight pairs of 32-bit floats; with 512-bit registers, sixteen. Compilers can vectorize simple loops automatically, but they need to know that the arrays do not overlap and that the number of iterations is large enough. For the hottest loops, such as matrix multiplication and the dot products inside attention, programmers often write the vector code by hand with intrinsics, one version for each instruction set, and pick the right version when the program starts.

Networking in more detail

A TCP connection starts with a handshake of three packets and ends with an exchange of four. In between, the sender keeps a window of bytes that may be in flight without an acknowledgment. The window grows while packets arrive safely and shrinks when one is lost, which is how TCP shares a link fairly among many connections and avoids overwhelming the network. Because of this slow start, a new connection cannot use the full bandwidth right away, which is one reason clients reuse connections for many requests.

HTTP sits on top of TCP. In its first versions each request had to wait for the previous response on the same connection. Later versions multiplex many requests over one connection and compress the headers, and the newest version runs over a transport built on UDP that avoids the head-of-line blocking of TCP. For streaming responses, such as tokens generated one at a time, the server keeps the response open and sends each chunk as soon as it is ready, so the user sees the answer appear word by word.

Domain names are translated into addresses by DNS, a distributed database with caches at every level. A lookup that misses every cache may take a hundred milliseconds, which is why browsers and operating systems keep the answers for as long as they are allowed to. Load balancers spread the incoming connections across many servers and stop sending traffic to a server whose health check fails.

Keeping software healthy

Software that runs for a long time needs care. Dependencies release new versions with security fixes; operating systems change; the data grows beyond what the original design expected. A project stays healthy when it can be built from a clean checkout with one command, when its tests run on every change, and when a new contributor can make a small fix on their first day.

Automated checks catch problems early. A formatter keeps the style consistent so that reviews can focus on content. Static analysis finds null dereferences, unused variables and suspicious casts. Sanitizers catch memory errors and data races while the tests run. Continuous integration runs all of it on every change, on every supported platform, and refuses to merge a change that breaks the build.

When something does break in production, the first goal is to restore service, and the second is to understand what happened. A short written review afterwards describes the timeline, the cause, what worked, what did not, and what will change so that the same failure cannot happen again. The review is about the system, not about blaming a person; people make mistakes, and a good system makes them hard to make and easy to recover from.
)txt";

constexpr std::string_view kGlossary = R"txt(Glossary

batch: a group of requests processed together in one step.
block: a fixed number of consecutive tokens whose keys and values are stored together in the cache.
byte pair encoding: a way to build a vocabulary by repeatedly merging the most frequent adjacent pair of symbols.
cache hit: a lookup that finds what it needs in the cache; a cache miss has to fetch it from slower storage.
context window: the largest number of tokens the model can attend to at once.
decode step: one forward pass that produces one new token for each running sequence.
embedding: a vector of numbers that represents a token inside the model.
greedy decoding: always choosing the most likely next token.
kernel: a function that runs on the accelerator, usually over many elements in parallel.
latency: the time one request takes from arrival to completion.
logits: the raw scores the model assigns to every token in the vocabulary before they are turned into probabilities.
prefill: the forward pass over the prompt, which fills the cache before generation starts.
quantization: storing numbers with fewer bits, usually small integers with a shared scale.
sampling: choosing the next token at random according to the model's probabilities, often after applying temperature, top-k or top-p.
scheduler: the part of a server that decides which requests run in the next step.
stop sequence: a string that ends generation as soon as it appears in the output.
temperature: a number that flattens or sharpens the probability distribution before sampling.
throughput: the number of tokens or requests completed per second.
token: a piece of text, such as a word, part of a word, a punctuation mark or a single byte.
vocabulary: the list of all tokens a tokenizer knows, each with its id.
)txt";
}  // namespace

std::vector<std::string_view> builtin_corpus_prose() { return {kProse, kWorld, kMore, kProse2, kDialogue, kStory, kProse3, kFaq, kWorld2, kProse4, kGlossary}; }

std::string_view builtin_corpus() {
  static const std::string corpus = [] {
    std::string s;
    const std::vector<std::string_view> prose = builtin_corpus_prose();
    const std::vector<std::string_view> code = builtin_corpus_code();
    // Interleave prose and code so that any prefix of the corpus has some of both.
    for (size_t i = 0; i < prose.size() || i < code.size(); ++i) {
      if (i < prose.size()) s.append(prose[i]).push_back('\n');
      if (i < code.size()) s.append(code[i]).push_back('\n');
    }
    return s;
  }();
  return corpus;
}

}  // namespace duet
