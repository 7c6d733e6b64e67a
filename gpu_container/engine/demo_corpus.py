"""The built-in text the demo tokenizer is trained on: plain English plus a little emoji and CJK, so
the byte-level BPE learns multi-byte UTF-8 tokens and the demo model's babble contains them."""

DEMO_CORPUS = """\
The river rose in the night, and by morning the old gate at the mill was under water.
People came down from the hill to watch the flood gate open, one slow turn of the wheel at a time.
When the gate opens, the water does not rush at once; it finds the lowest path and follows it.
A good system works the same way: it lets in what it can carry and asks the rest to wait.
The miller kept a small book in which he wrote the level of the river every hour of the day.
On quiet days the numbers barely changed. On stormy days he wrote until his pencil was short.
His daughter asked him why he wrote so much. He said that a number you never wrote down is a guess.
She laughed, took the book, and added a drawing of a duck at the bottom of the page 🦆.
In spring the fields turned green, the bees came back, and the road to the market dried out.
Farmers carried bread, cheese, apples and honey to the square, and the square filled with voices.
A traveller asked for the way to the station. Go past the bakery, turn left at the fountain,
and keep walking until you hear the trains. You cannot miss it; everyone goes there sooner or later.
The baker rose before dawn to light the oven. Flour, water, salt and time: that is all bread needs.
He said that patience is the secret ingredient, and that most people add too little of it 🍞.
Children ran along the bank with paper boats, racing them against the current and each other.
One boat made it all the way to the bridge, and the whole street cheered as if it were a ship.
The teacher wrote a question on the board: how many drops of rain fill a river? Nobody knew.
A quiet boy raised his hand and said: as many as it takes. The teacher smiled and wrote it down.
Weather is a conversation between the sea and the sky, and we only hear half of what they say.
The clouds came in from the west, grey and heavy, and the first drops fell on the dusty road 🌧️.
By evening the storm had passed. The air smelled of wet stone and cut grass, and the birds sang.
Stars came out one by one over the valley ✨, and the lights of the town answered them.
Hello, world! Thank you, please, good morning, good night, see you tomorrow, have a nice day 😀.
Numbers: one, two, three, four, five, six, seven, eight, nine, ten, one hundred, one thousand.
Colours: red, orange, yellow, green, blue, violet, black, white, grey, brown, gold and silver.
Questions help us learn. What is it? Where is it? When did it happen? Why does it matter? How?
Answers are better when they are short, clear and kind, and best when they are also true 👍.
A friend from Tokyo wrote: 今日は良い天気ですね。川の水がとてもきれいです。ありがとう！
A friend from Beijing wrote: 你好，世界。今天天气很好。我们去河边散步吧。谢谢你！
A friend from Seoul wrote: 안녕하세요. 오늘 날씨가 좋네요. 감사합니다!
Some words travel well: café, naïve, déjà vu, smörgåsbord, jalapeño, façade, über, crème brûlée.
The machine listened to the question, thought for a moment, and answered one word at a time.
Each word arrived a little after the one before, like boats passing under the bridge 🚣.
When too many people asked at once, the machine asked some of them to wait their turn politely.
Those who had paid for a ticket went first, but nobody was forgotten and everyone got an answer.
If someone left before the answer was finished, the machine stopped writing and moved on 🙂.
At the end of the day the miller closed his book, the baker cleaned his oven, the river ran on.
Tomorrow the gate would open again, the water would find its path, and the town would wake up.
🌊🌊🌊 The flood gate opens 🚪 and the river flows 🏞️ past the mill 🏭 toward the sea 🌅.
水 river 川 gate 门 light 光 rain 雨 bread 面包 book 本 star 星 🌟 sea 海 🐟 bird 鸟 🐦.
"""
